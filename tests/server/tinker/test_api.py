"""The real `tinker` SDK against a real session (its own server, the bundled model, LoRA): training, sampling
from the trainer's weights, futures batched on the mesh, custom losses, weights saved and loaded, bad input
answered 400 with the field named while the session goes on, and what is not served named in Tinker's shape."""

from __future__ import annotations

import pytest

tinker = pytest.importorskip("tinker")

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from tinker import types  # noqa: E402

import forge_nb  # noqa: E402
from tests.conftest import wait_no_children  # noqa: E402

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1, "lora": {"r": 8}}
TEXT = [1, 6, 7, 4, 8, 15, 6, 10, 2]  # "12+3=15" in the bundled model's 16-token vocabulary, EOS last


@pytest.fixture(scope="module")
def session():
    s = forge_nb.up(name="tinker-api", persist=False, **SMALL)
    yield s
    s.down()
    assert wait_no_children(30) == []


@pytest.fixture(scope="module")
def endpoint(session, monkeypatch_module):
    view = session.serve_tinker()
    monkeypatch_module.setenv("TINKER_TELEMETRY", "0")
    return view


@pytest.fixture(scope="module")
def monkeypatch_module():
    with pytest.MonkeyPatch.context() as patch:
        yield patch


@pytest.fixture(scope="module")
def client(endpoint):
    """One Tinker client for the module: its training client (LoRA rank 8, as the session's: no restart)."""
    with tinker.ServiceClient(base_url=endpoint.url, api_key=endpoint.api_key) as service:
        yield service, service.create_lora_training_client(base_model="bundled", rank=8).result()


def datum(tokens=TEXT, weights="ones", **inputs) -> types.Datum:
    """A datum of `tokens` (targets: shifted by one), weights 1 (None: no weights), and `inputs`."""
    n = len(tokens) - 1
    given = {"target_tokens": tokens[1:], **inputs}
    if weights is not None:
        given["weights"] = [1.0] * n if weights == "ones" else weights
    return types.Datum(model_input=types.ModelInput.from_ints(tokens[:-1]), loss_fn_inputs=given)


def test_a_client_trains_and_its_sampling_client_serves_the_trainers_weights(session, endpoint, client):
    _, training = client
    info = training.get_info()
    assert info.model_data.model_name == str(session.config.model.resolved_path()) and info.lora_rank == 8
    assert training.get_tokenizer().decode([6, 7]) is not None  # what the SDK loads offline from model_name
    losses = []
    for _ in range(3):
        result = training.forward_backward([datum()], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        losses.append(result.metrics["loss:sum"])
    assert losses[-1] < losses[0]
    sampler = training.save_weights_and_get_sampling_client().result()
    checks = session.checksums()
    assert checks["trainer"] == checks["generator"] and checks["trainer"][0] == session.trainer_version
    prompt = types.ModelInput.from_ints(TEXT[:4])
    params = types.SamplingParams(max_tokens=4, temperature=1.0, stop=[2], seed=7)
    first = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    again = sampler.sample(prompt, num_samples=3, sampling_params=params).result()
    assert [s.tokens for s in first.sequences] == [s.tokens for s in again.sequences]  # the seed decides
    for s in first.sequences:
        assert len(s.tokens) == len(s.logprobs) <= 4
        assert (s.stop_reason == "stop") == (s.tokens[-1] == 2)  # the stop token stays in the sample
    prompt_logprobs = sampler.compute_logprobs(types.ModelInput.from_ints(TEXT)).result()
    trainer_view = training.forward([datum()], "cross_entropy").result().loss_fn_outputs[0]["logprobs"].tolist()
    assert prompt_logprobs[0] is None and prompt_logprobs[1:] == pytest.approx(trainer_view, abs=1e-4)
    # the notebook sees the run as its own
    steps = session.metrics_stream.to_pandas("step")
    assert (steps["mode"] == "tinker").sum() >= 3 and steps["loss"].notna().all()
    refreshes = session.versions("policy")
    assert refreshes["change"].iloc[-1].startswith("tinker: save_weights_for_sampler")
    assert refreshes["version"].iloc[-1] == session.generator_version
    recent = session.samples(6)  # the samples, beside the session's own (rewards are the client's: NaN)
    assert (
        len(recent) == 6 and recent["reward"].isna().all() and (recent["policy_version"] == checks["trainer"][0]).all()
    )


def test_pipelined_calls_all_answer_and_the_samples_go_to_their_steps_log(session, client):
    """Many requests in flight at once (how they are batched: tests/server/tinker/test_queues.py)."""
    service, training = client
    before = session.status()["tinker"]
    futures = [training.forward_backward([datum()], "cross_entropy") for _ in range(6)]
    step = training.optim_step(types.AdamParams(learning_rate=1e-3))
    losses = [f.result().metrics["loss:sum"] for f in futures]
    step.result()
    assert losses == pytest.approx([losses[0]] * 6, rel=1e-5)  # each request gets its own datums' loss back
    sampler = training.save_weights_and_get_sampling_client().result()
    prompt, params = types.ModelInput.from_ints(TEXT[:3]), types.SamplingParams(max_tokens=3)
    samples = [sampler.sample(prompt, num_samples=2, sampling_params=params) for _ in range(8)]
    assert all(len(f.result().sequences) == 2 for f in samples)
    after = session.status()["tinker"]
    assert after["forward_backward_requests"] - before["forward_backward_requests"] == 6
    assert after["sample_requests"] - before["sample_requests"] == 8
    assert after["trainer_calls"] - before["trainer_calls"] <= 6 and after["pending"] == 0
    training.forward_backward([datum()], "cross_entropy").result()
    training.optim_step(types.AdamParams(learning_rate=1e-3)).result()  # the samples go to its step's log
    logged = session.samples(step=session.step_count)
    assert len(logged) == 16 and logged["prompt_id"].str.startswith("tinker:").all()


def test_a_custom_loss_trains_through_forward_backward_custom(client):
    _, training = client

    def likelihood(data, logprobs):  # any differentiable function of the logprobs: here -sum(logprobs)
        loss = -sum(lp.sum() for lp in logprobs)
        return loss, {"custom:sum": loss.item()}

    losses = []
    for _ in range(3):
        result = training.forward_backward_custom([datum()], likelihood).result()
        training.optim_step(types.AdamParams(learning_rate=1e-2)).result()
        losses.append(result.metrics["loss:sum"])
    assert losses[-1] < losses[0]
    assert result.metrics["custom:sum"] == pytest.approx(result.metrics["loss:sum"], rel=1e-5)
    # its surrogate is cross_entropy with weights -dC/dlogprobs = 1: the same sum as the loss
    assert result.metrics["surrogate_loss:sum"] == pytest.approx(result.metrics["loss:sum"], rel=1e-4)


@pytest.mark.parametrize(
    ("data", "loss_fn", "named"),
    [
        ([datum(tokens=[1, 6, 99, 2])], "cross_entropy", "data[0].model_input: token 99 at position 2"),
        ([datum(weights=[1.0, 1.0])], "cross_entropy", "data[0].loss_fn_inputs.weights: 2 values, the model"),
        (
            [datum(weights=None, advantages=[1.0] * 8)],
            "importance_sampling",
            "data[0].loss_fn_inputs.logprobs: missing",
        ),
        (
            [datum(mask=np.ones(8, np.float32))],
            "cross_entropy",
            "data[0].loss_fn_inputs.mask: not an input of cross_entropy",
        ),
        ([datum(), datum(tokens=[1, 2])], "gspo", "loss_fn: 'gspo' is not served"),
    ],
    ids=["token-past-vocabulary", "input-of-wrong-length", "missing-input", "unknown-input", "unserved-loss"],
)
def test_bad_input_is_answered_400_naming_the_field_and_the_session_goes_on(session, client, data, loss_fn, named):
    _, training = client
    with pytest.raises(tinker.BadRequestError, match="Error code: 400") as raised:
        training.forward_backward(data, loss_fn).result()
    assert named in str(raised.value)
    assert training.forward_backward([datum()], "cross_entropy").result().metrics["loss:sum"] > 0


def test_the_session_still_steps_after_bad_input_and_dro_needs_its_beta(session, client):
    _, training = client
    rl = datum(logprobs=[-2.0] * 8, advantages=[1.0] * 8, weights=None)
    with pytest.raises(tinker.BadRequestError, match="loss_fn_config.beta: dro requires it"):
        training.forward_backward([rl], "dro").result()
    assert training.forward_backward([rl], "dro", {"beta": 0.05}).result().metrics["loss:sum"] != 0
    training.optim_step(types.AdamParams(learning_rate=1e-4)).result()
    before = session.step_count
    session.step(1)  # the notebook's own step, between Tinker's
    assert session.step_count == before + 1


@pytest.mark.filterwarnings("ignore:DEPRECATED:FutureWarning")  # load_state on a training client: still served
def test_weights_saved_and_loaded_with_and_without_the_optimizer(session, endpoint, client):
    service, training = client
    saved = training.save_state("s1").result().path
    sampler_path = training.save_weights_for_sampler("s1").result().path
    rest = tinker.RestClient(base_url=endpoint.url, api_key=endpoint.api_key)
    listed = {c.tinker_path for c in rest.list_checkpoints(training.model_id).result().checkpoints}
    assert {saved, sampler_path} <= listed
    checksum = session.checksums()["trainer"][1]

    def moved() -> None:
        training.forward_backward([datum()], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=5e-2)).result()
        assert session.checksums()["trainer"][1] != checksum

    moved()
    training.load_state(saved).result()  # weights only, into the same training client
    assert session.checksums()["trainer"][1] == checksum
    moved()
    training.load_state_with_optimizer(saved).result()
    assert session.checksums()["trainer"][1] == checksum
    with pytest.raises(tinker.NotFoundError, match="no checkpoint"):
        training.load_state(saved.replace("/s1", "/nope")).result()
    # a training client made from the state (the SDK's way now): the same client's next model, the trainer's own
    resumed = service.create_training_client_from_state_with_optimizer(saved).result()
    assert session.checksums()["trainer"][1] == checksum and resumed.get_info().lora_rank == 8
    resumed.forward_backward([datum()], "cross_entropy").result()
    resumed.optim_step(types.AdamParams(learning_rate=1e-3)).result()
    assert session.status()["tinker"]["model"] == resumed.model_id != training.model_id  # (the tests after: none)


def test_what_is_not_served_answers_tinkers_error_shape_naming_it(endpoint):
    headers = {"X-API-Key": endpoint.api_key}
    answer = httpx.post(f"{endpoint.url}/api/v1/copy_weights", json={}, headers=headers)
    assert answer.status_code == 404 and "does not serve POST /api/v1/copy_weights" in answer.json()["detail"]
    wrong = httpx.post(f"{endpoint.url}/api/v1/client/config", json={}, headers={"X-API-Key": "tml-wrong"})
    assert wrong.status_code == 401 and "wrong API key" in wrong.json()["detail"]


def test_a_second_model_waits_for_the_first_clients_end_then_takes_the_trainer_afresh(session, endpoint, client):
    with tinker.ServiceClient(base_url=endpoint.url, api_key=endpoint.api_key) as other:
        with pytest.raises(tinker.BadRequestError, match="trains one model at a time"):
            other.create_lora_training_client(base_model="bundled", rank=4).result()
    service, _ = client
    first = session.status()["tinker"]["model"]
    service.close("success").result()  # the module's client is done: its model gives the trainer up
    version = session.trainer_version
    with tinker.ServiceClient(base_url=endpoint.url, api_key=endpoint.api_key) as other:
        model_dir = str(session.config.model.resolved_path())
        training = other.create_lora_training_client(base_model=model_dir, rank=4).result()
        assert training.get_info().lora_rank == 4
        assert session.trainer_version == session.generator_version == version + 1  # fresh, published, served
        checks = session.checksums()
        assert checks["trainer"] == checks["generator"]
        training.forward_backward([datum()], "cross_entropy").result()
        training.optim_step(types.AdamParams(learning_rate=1e-3)).result()
        old = httpx.post(
            f"{endpoint.url}/api/v1/get_info",
            json={"model_id": first},
            headers={"X-API-Key": endpoint.api_key},
        )
        assert old.status_code == 400 and "no longer trains" in old.json()["detail"]
        with pytest.raises(tinker.BadRequestError, match="is not this session's model"):
            other.create_lora_training_client(base_model="Qwen/Qwen3-8B", rank=4).result()


def test_a_request_without_the_key_is_counted_as_a_refusal_of_the_tinker_listener():
    from unittest.mock import MagicMock

    from starlette.testclient import TestClient

    from forge_nb.runtime.refusals import REFUSED
    from forge_nb.server.tinker.routes import make_app

    listener = "Tinker API test:0"
    service = MagicMock()  # (a 401 never reaches the service)
    app = TestClient(make_app(service, "tml-right", lambda: listener))
    assert app.post("/api/v1/client/config", json={}).status_code == 401
    assert app.post("/api/v1/client/config", json={}, headers={"X-API-Key": "tml-wrong"}).status_code == 401
    totals = REFUSED.totals()
    assert totals[f"{listener}: no API key"] == 1 and totals[f"{listener}: a wrong API key"] == 1
    assert not service.mock_calls
