"""policy_update: leaving zero-advantage sequences out of the forward/backward changes nothing."""

import copy
import dataclasses

import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import AlgorithmConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl.batch import collate
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.train_step import policy_update

LOSSES = [
    AlgorithmConfig(loss="grpo"),
    AlgorithmConfig(loss="grpo", token_level=True),
    AlgorithmConfig(loss="dr_grpo"),
    AlgorithmConfig(loss="dapo"),
    AlgorithmConfig(loss="aipo"),
]


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)


def _batch(model, advantages: list[float], layout=collate):
    """Sequences of varied length (pairs share a prompt, as groups do) whose behaviour logprobs are the
    model's, perturbed (ratios != 1); `layout`: full sequences (`collate`) or each prompt once (`collate_prefix`)."""
    gen = torch.Generator().manual_seed(0)
    n = len(advantages)
    prompts = [[1] + torch.randint(3, 15, (3 + i % 3,), generator=gen).tolist() for i in range(0, n, 2)]
    prompts = [p for p in prompts for _ in range(2)][:n]
    completions = [torch.randint(3, 15, (1 + i % 4,), generator=gen).tolist() + [2] for i in range(n)]
    batch = layout(prompts, completions, 0, None, advantages)
    with torch.no_grad():
        noise = 0.3 * torch.randn(batch.old_logprobs.shape, generator=gen)
        batch.old_logprobs = (batch.logprobs(model) + noise) * batch.completion_mask
    return batch


def _step(model, batch, loss_fn, skip: bool):
    """One SGD step at lr 1 on a copy -> (metrics, parameter change = -clipped gradient)."""
    trained = copy.deepcopy(model)
    before = {n: p.detach().clone() for n, p in trained.named_parameters()}
    optimizer = torch.optim.SGD(trained.parameters(), lr=1.0)
    metrics, _ = policy_update(trained, optimizer, batch, loss_fn, skip_zero_advantage=skip)
    return metrics, {n: p.detach() - before[n] for n, p in trained.named_parameters()}


@pytest.mark.parametrize("layout", [collate, collate_prefix])
@pytest.mark.parametrize("algorithm", LOSSES, ids=lambda a: a.loss + ("_token" if a.token_level else ""))
def test_skipping_zero_advantage_sequences_leaves_loss_and_gradient_unchanged(model, algorithm, layout):
    code = builtin_loss(algorithm, max_tokens=8)
    assert code.zero_advantage_inert
    loss_fn = compile_function(code)
    batch = _batch(model, [0.0, 1.3, 0.0, -0.7, 0.0, 0.0, 2.0, -1.1], layout)
    full, full_delta = _step(model, batch, loss_fn, skip=False)
    skipped, skipped_delta = _step(model, batch, loss_fn, skip=True)
    assert full["rows_skipped"] == 0 and skipped["rows_skipped"] == 4
    assert skipped["loss"] == pytest.approx(full["loss"], abs=1e-6)
    assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    for name, delta in full_delta.items():
        assert torch.allclose(skipped_delta[name], delta, atol=1e-6), name
    assert skipped["tokens"] == full["tokens"]


def test_a_batch_with_no_advantage_takes_its_usual_step_without_a_forward(model):
    """All advantages 0: zero gradients, and AdamW moves by its moments exactly as if backward had run."""
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(), max_tokens=8))
    metrics, delta = _step(model, _batch(model, [0.0] * 4), loss_fn, skip=True)
    assert metrics["rows_skipped"] == 4 and metrics["loss"] == 0.0 and metrics["grad_norm"] == 0.0
    assert all(bool((d == 0).all()) for d in delta.values())  # SGD: nothing moves
    informative, idle = _batch(model, [1.0, -1.0, 0.5, -0.5]), _batch(model, [0.0] * 4)
    updates = []
    for skip in (False, True):
        trained = copy.deepcopy(model)
        optimizer = torch.optim.AdamW(trained.parameters(), lr=1e-2)
        policy_update(trained, optimizer, informative, loss_fn, skip_zero_advantage=skip)  # moments now non-zero
        before = {n: p.detach().clone() for n, p in trained.named_parameters()}
        policy_update(trained, optimizer, idle, loss_fn, skip_zero_advantage=skip)
        updates.append({n: p.detach() - before[n] for n, p in trained.named_parameters()})
    assert any(bool((d != 0).any()) for d in updates[0].values())  # AdamW did move on zero gradients
    for name, delta in updates[0].items():
        assert torch.allclose(updates[1][name], delta, atol=1e-7), name


def test_only_built_in_losses_without_kl_are_marked_inert():
    assert not builtin_loss(dataclasses.replace(AlgorithmConfig(), kl_coef=0.1), max_tokens=8).zero_advantage_inert
    assert not LiveCode("loss", "loss", "def loss(*a): ...", "cell").zero_advantage_inert
