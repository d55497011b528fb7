"""vLLM (CPU build) behind the generator actor of a real session: generation, logprobs, refresh in place.

One session for the module: vLLM's start (~45 s on 2 cores, warm-up included) is paid once.
"""

from __future__ import annotations

import pytest

from forge_nb.engines.base import SamplingParams
from forge_nb.engines.vllm_engine import vllm_available
from forge_nb.runtime.calls import on_gang, wait
from forge_nb.session import Session
from tests.conftest import wait_no_children

pytestmark = [pytest.mark.slow, pytest.mark.skipif(not vllm_available(), reason="vLLM is not installed")]

TOLERANCE = 1e-4  # max abs logprob difference, vLLM (float32 CPU kernels) vs the trainer's HF forward


@pytest.fixture(scope="module")
def s():

    session = Session.up(engine="vllm", prompts_per_step=4, group_size=4, threads_per_proc=1, temperature=1.0)
    yield session
    session.down()
    assert wait_no_children() == []


def generate(s, prompts, sampling):
    generation = wait(s.fleet.generator.slice(procs=0).generate.call_one(prompts, sampling))
    return generation.completions, generation.policy_version


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def test_up_serves_with_vllm(s):
    assert s.status()["engine"] == "vllm"
    info = wait(s.fleet.generator.slice(procs=0).ready.call_one())
    assert info.details["engine"] == "vllm" and info.start_s > 0


def test_rollout_logprobs_match_the_trainer_at_the_same_version(s):
    r = s.rollout()
    cfg = s.config.algorithm
    assert len(r.episodes) == cfg.prompts_per_step * cfg.group_size
    assert all(len(e.logprobs) == len(e.completion_ids) >= 1 for e in r.episodes)
    prompts, completions = [e.prompt_ids for e in r.episodes], [e.completion_ids for e in r.episodes]
    recomputed = wait(s.fleet.trainer.logprobs.call_one(prompts, completions))
    assert max_diff([e.logprobs for e in r.episodes], recomputed) < TOLERANCE


def test_train_and_sync_reach_the_running_engine(s):
    """A fixed prompt + completion: vLLM's logprobs move with the refresh and equal the trainer's after it."""
    assert_trained_steps_reach_the_engine(s, 3)


def assert_trained_steps_reach_the_engine(s, steps: int) -> None:
    """On a fixed prompt + completion, the logprobs the generator (replica 0) serves move with `steps` trained
    steps (by more than 10x `TOLERANCE`: training moved the weights) and equal the trainer's (to `TOLERANCE`)
    after the sync, which serves the version `steps` later. Any engine, trainer gang, or LoRA."""
    prompt = [s.tokenizer("17+25=")["input_ids"]]
    completion = [s.tokenizer("42", add_special_tokens=False)["input_ids"] + [s.tokenizer.eos_token_id]]
    generator = s.fleet.generator.slice(procs=0)
    before, version = wait(generator.logprobs.call_one(prompt, completion))
    for _ in range(steps):
        s.train(s.rollout())
    trainer = on_gang(s.fleet.trainer, "logprobs", prompt, completion)
    assert max_diff(before, trainer) > 10 * TOLERANCE
    report = s.sync()
    after, served = wait(generator.logprobs.call_one(prompt, completion))
    assert served == report["version"] == version + steps
    assert max_diff(after, trainer) < TOLERANCE


def test_seeded_sampling_is_reproducible_and_samples_differ(s):
    sampling = SamplingParams(n=8, temperature=1.0, max_tokens=6, seed=7)
    a, _ = generate(s, ["12+34=", "12+34="], sampling)
    b, _ = generate(s, ["12+34=", "12+34="], sampling)
    assert [[c.token_ids for c in g] for g in a] == [[c.token_ids for c in g] for g in b]
    # Same prompt twice in one batch: each prompt draws its own seeds, so the two groups differ.
    assert [c.token_ids for c in a[0]] != [c.token_ids for c in a[1]]


def test_stop_strings_end_the_completion(s):
    sampling = SamplingParams(n=1, temperature=0.0, max_tokens=6)
    (full,), _ = generate(s, ["11+11="], sampling)
    text = full[0].text
    assert len(text) >= 2
    (cut,), _ = generate(s, ["11+11="], SamplingParams(n=1, temperature=0.0, max_tokens=6, stop=(text[1],)))
    assert cut[0].finish_reason == "stop" and cut[0].text == text[: text.index(text[1])]
    assert len(cut[0].logprobs) == len(cut[0].token_ids) <= len(full[0].token_ids)


def test_a_seeded_batch_larger_than_one_scheduler_step_generates_on_the_cpu(s):
    """600 prompts x 8 samples: more prompt tokens than vLLM schedules at once. A prefill split over steps
    would make vLLM rewind the seeded CPU generator, which fails ("CPU Generator does not use offset")."""
    prompts = [f"{a}+{b}=" for a in range(20, 80) for b in range(10)]
    sampling = SamplingParams(n=8, temperature=1.0, max_tokens=2, seed=3)
    first, _ = generate(s, prompts, sampling)
    again, _ = generate(s, prompts, sampling)
    assert len(first) == 600 and all(len(group) == 8 for group in first)
    assert [[c.token_ids for c in g] for g in first] == [[c.token_ids for c in g] for g in again]
