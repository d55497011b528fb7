"""The trainer's options at 2 ranks (FSDP2 on gloo, real processes): LoRA, activation checkpointing and
bf16 mixed precision take the step they should."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from forge_nb.config import AlgorithmConfig, LoraConfig, TrainerConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.live.validate import check_loss_value
from forge_nb.models import BUNDLED_MODEL
from forge_nb.testing.gang import run_gang
from tests.parallel.test_policy import STEPS, batches, two_micro_batch_budget


def train(rank: int, world: int, trainer: dict, lora: bool, on_policy: bool = False) -> dict:
    """`STEPS` GRPO updates of the bundled policy at `world` ranks with `trainer` options -> the metrics,
    the whole published tensors after the last step and their dtypes. `on_policy`: each batch's behaviour
    logprobs are the float32 policy's own (ratio 1), not made up."""
    from forge_nb.parallel.gang import Gang
    from forge_nb.parallel.policy import Policy, PolicySpec

    sharded = world > 1 or trainer.get("mixed_precision", "none") != "none"
    gang = Gang.join(torch.device("cpu"), 60.0) if sharded else Gang()
    options = TrainerConfig(**trainer)
    adapter = LoraConfig(enabled=True, r=4, alpha=8.0) if lora else None
    spec = PolicySpec(BUNDLED_MODEL, "float32", "cpu", 0, 1.0, options, sharded, 5e-3 if lora else 5e-4, adapter)
    policy = Policy(spec, gang)
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=6))
    rows = []
    for batch in batches():
        if on_policy:
            batch = dataclasses.replace(batch, logprobs=_fp32_logprobs(batch))
        rows.append(policy.update(batch, loss_fn, 1.0, check_loss_value, True)[0])
    whole = {n: t.clone() for n, t in policy.whole_published()}
    dtypes = {str(p.dtype) for p in policy.model.parameters()}
    return {"metrics": rows, "weights": whole, "dtypes": dtypes}


def _fp32_logprobs(batch) -> list[list[float]]:
    from transformers import AutoModelForCausalLM

    from forge_nb.rl.prefix_batch import completion_logprobs

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
    return completion_logprobs(model, batch.prompt_ids, batch.completion_ids, 0, 1.0)


def _same(a: dict, b: dict) -> None:
    """The same losses and, bit for bit, the same published tensors after the last step."""
    for step in range(STEPS):
        assert a["metrics"][step]["loss"] == pytest.approx(b["metrics"][step]["loss"], rel=1e-5, abs=1e-6)
    assert a["weights"].keys() == b["weights"].keys()
    for name, w in a["weights"].items():
        assert torch.equal(w, b["weights"][name]), name


def test_lora_at_two_ranks_takes_the_one_rank_steps():
    trainer = {"micro_batch_tokens": two_micro_batch_budget()}
    (one,) = run_gang(1, train, trainer, True)
    two = run_gang(2, train, trainer, True)
    assert all(".lora_" in name for name in two[0]["weights"])  # only the adapter is published
    assert any(bool((w != 0).any()) for n, w in two[0]["weights"].items() if "lora_B" in n)  # it trained
    _same(two[0], one)


def test_activation_checkpointing_at_two_ranks_takes_the_one_rank_steps():
    """Recomputed activations, full sequences: the same step as one rank without either (the layouts
    round differently: the first step agrees to 1e-5, not in the last bit)."""
    (one,) = run_gang(1, train, {}, False)
    two = run_gang(2, train, {"activation_checkpointing": True}, False)
    first = two[0]["metrics"][0], one["metrics"][0]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], abs=1e-6)
    assert first[0]["grad_norm"] == pytest.approx(first[1]["grad_norm"], rel=1e-5)


def test_bf16_mixed_precision_at_two_ranks_computes_in_bf16_on_float32_weights():
    """On-policy steps (ratio 1 at the first): bf16 compute rounds the logprobs (on this 128-wide model
    enough to move the gradient norm by ~20% from float32's), the same at 1 and 2 ranks."""
    (fp32,) = run_gang(1, train, {}, False, True)
    (one,) = run_gang(1, train, {"mixed_precision": "bf16"}, False, True)
    two = run_gang(2, train, {"mixed_precision": "bf16"}, False, True)
    assert two[0]["dtypes"] == {"torch.float32"}  # master weights stay float32
    assert abs(two[0]["metrics"][0]["approx_kl"]) > 1e-3 > abs(fp32["metrics"][0]["approx_kl"])  # ran in bf16
    assert two[0]["metrics"][0]["loss"] == pytest.approx(fp32["metrics"][0]["loss"], abs=1e-2)
    for step in range(STEPS):
        assert two[0]["metrics"][step]["grad_norm"] == pytest.approx(one["metrics"][step]["grad_norm"], rel=1e-2)
