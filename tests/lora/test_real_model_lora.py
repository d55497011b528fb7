"""LoRA on the real SmolLM2-135M-Instruct: rollout / train / sync on both engines with only the adapter
moving, the generator's logprobs equal to the trainer's after a refresh, save / resume bit for bit with
the adapter and its optimizer state, and an export in peft's format."""

import peft
import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow

ROWS = [
    {"q": f"What is {a} + {b}? Answer with the number only.", "a": str(a + b)} for a in range(3, 40, 3) for b in (4, 9)
]
LORA = {"r": 8, "alpha": 16, "target_modules": ["q_proj", "v_proj", "o_proj", "down_proj"]}
SETUP = dict(
    model="smollm2-135m-instruct",
    task=ROWS,
    prompt_column="q",
    answer_column="a",
    prompts_per_step=2,
    group_size=4,
    max_tokens=12,
    lr=2e-3,  # adapters take a larger step than full fine-tuning; big enough that the logprobs move
    kl_coef=0.01,  # the reference: the trainer's base with the adapter off
    lora=LORA,
)
FULL_BYTES = 538_000_000  # SmolLM2-135M in float32: what a full refresh moves
TOLERANCE = 1e-3


def max_diff(a: list[list[float]], b: list[list[float]]) -> float:
    return max(abs(x - y) for ra, rb in zip(a, b) for x, y in zip(ra, rb))


def shorter(prompt, completion, target):
    return -len(completion) / 50  # varies within every group, so the adapter gets a gradient from step 1


def _train_sync_and_compare(s) -> dict:
    """Two steps, a refresh after each; then the generator's sampling logprobs of a fresh rollout and its
    teacher-forced scores equal the trainer's -> the last refresh report."""
    s.set_reward(shorter, name="short", weight=1.0)
    prompt = [s.tokenizer("What is 17 + 25?")["input_ids"]]
    completion = [s.tokenizer(" 42", add_special_tokens=False)["input_ids"] + [s.tokenizer.eos_token_id]]
    before, _ = wait(s.fleet.generator.slice(procs=0).logprobs.call_one(prompt, completion))
    for version in (1, 2):
        metrics = s.train(s.rollout())
        assert metrics["policy_version"] == version and "kl_ref" in metrics
        report = s.sync()
        assert report["version"] == version and 0 < report["bytes"] < FULL_BYTES / 50
    after, served = wait(s.fleet.generator.slice(procs=0).logprobs.call_one(prompt, completion))
    trainer = wait(s.fleet.trainer.logprobs.call_one(prompt, completion))
    assert served == 2 and max_diff(before, trainer) > 10 * TOLERANCE  # the adapter moved the policy
    assert max_diff(after, trainer) < TOLERANCE
    r = s.rollout()
    assert {e.policy_version for e in r.episodes} == {2}
    ids = [e.prompt_ids for e in r.episodes], [e.completion_ids for e in r.episodes]
    assert max_diff([e.logprobs for e in r.episodes], wait(s.fleet.trainer.logprobs.call_one(*ids))) < TOLERANCE
    sums = s.checksums()
    assert sums["trainer"] == sums["generator"]  # the adapter served is the one trained, bit for bit
    return report


def test_lora_on_the_torch_engine_trains_syncs_resumes_and_exports(tmp_path):
    s = Session.up(engine="torch", **SETUP)
    try:
        sizes = s.status()["trainer"]
        assert sizes["lora"] and sizes["trainable_params"] < sizes["total_params"] / 50
        assert sizes["adapter_bytes"] == 4 * sizes["trainable_params"] <= sizes["refresh_bytes"] < FULL_BYTES / 50
        assert "reference" not in s.status()["procs"]  # no second copy of the weights
        _train_sync_and_compare(s)
        s.save(tmp_path / "ck")
        s.step(1)
        a = s.checksums(), s.metrics_stream.to_pandas("step")[["loss", "policy_version"]]
        s.save_checkpoint(tmp_path / "export")
        # A real answer: arbitrary ids ([1, 2, 3, 4] -> [5, 6, 7]) sit near logprob -24, where float32 sums of a
        # merged and an unmerged adapter differed by 1.03e-3 in one suite run.
        prompt = s.tokenizer("What is 17 + 25?")["input_ids"]
        answer = s.tokenizer(" 42", add_special_tokens=False)["input_ids"] + [s.tokenizer.eos_token_id]
        trained = wait(s.fleet.trainer.logprobs.call_one([prompt], [answer]))
    finally:
        s.down()
    r = Session.restore(tmp_path / "ck")
    try:
        assert (r.trainer_version, r.generator_version) == (2, 2)
        r.step(1)
        b = r.checksums(), r.metrics_stream.to_pandas("step")[["loss", "policy_version"]]
        assert a[0] == b[0] and a[1].equals(b[1])  # adapter (trainer and served) and losses, bit for bit
    finally:
        r.down()
    assert wait_no_children() == []
    base = AutoModelForCausalLM.from_pretrained(r.config.model.resolved_path())
    exported = peft.PeftModel.from_pretrained(base, tmp_path / "export").eval()
    with torch.no_grad():
        logits = exported(torch.tensor([prompt + answer])).logits[0].log_softmax(-1)
    exported_logprobs = [logits[len(prompt) - 1 + k, t].item() for k, t in enumerate(answer)]
    assert max_diff(trained, [exported_logprobs]) < TOLERANCE
    assert (tmp_path / "export" / "merged" / "config.json").is_file()


def test_lora_on_vllm_serves_each_version_as_an_adapter():
    s = Session.up(engine="vllm", **SETUP)
    try:
        assert s.status()["engine"] == "vllm"
        _train_sync_and_compare(s)
    finally:
        s.down()
    assert wait_no_children() == []
