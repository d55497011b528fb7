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
from forge_nb.rl.losses import grpo_loss, masked_mean
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.split import ONE_RANK, Split
from forge_nb.rl.update import UpdateOptions, policy_update

LOSSES = [
    AlgorithmConfig(loss="grpo"),
    AlgorithmConfig(loss="grpo", token_level=True),
    AlgorithmConfig(loss="dr_grpo"),
    AlgorithmConfig(loss="dapo"),
    AlgorithmConfig(loss="aipo"),
    AlgorithmConfig(loss="cispo", ratio_level="sequence", off_policy_mask=0.1),
    AlgorithmConfig(loss="sapo"),
    AlgorithmConfig(loss="grpo", ratio_level="sequence"),  # GSPO
    AlgorithmConfig(loss="dapo", clip_delta=1.5, off_policy_mask=0.1),
    AlgorithmConfig(loss="luspo", ratio_level="sequence"),
    AlgorithmConfig(loss="vespo"),
]


def _name(a: AlgorithmConfig) -> str:
    extra = [
        f"{f}={getattr(a, f)}"
        for f in ("ratio_level", "clip_delta", "off_policy_mask")
        if getattr(a, f) not in ("token", 0.0, None)
    ]
    return "_".join([a.loss + ("_token" if a.token_level else ""), *extra])


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
    metrics, _ = policy_update(trained, optimizer, batch, loss_fn, UpdateOptions(skip_zero_advantage=skip))
    return metrics, {n: p.detach() - before[n] for n, p in trained.named_parameters()}


@pytest.mark.parametrize("layout", [collate, collate_prefix])
@pytest.mark.parametrize("algorithm", LOSSES, ids=_name)
def test_skipping_zero_advantage_sequences_leaves_loss_and_gradient_unchanged(model, algorithm, layout):
    code = builtin_loss(algorithm, max_tokens=8)
    assert code.zero_advantage_inert
    loss_fn = compile_function(code)
    batch = _batch(model, [0.0, 1.3, 0.0, -0.7, 0.0, 0.0, 2.0, -1.1], layout)
    full, full_delta = _step(model, batch, loss_fn, skip=False)
    skipped, skipped_delta = _step(model, batch, loss_fn, skip=True)
    assert full["rows_skipped"] == 0 and skipped["rows_skipped"] == 4
    # (vespo's terms are A x logprobs (~2.5), not ratios (~1): the layouts' last bits show more)
    assert skipped["loss"] == pytest.approx(full["loss"], abs=1e-6, rel=5e-5 if algorithm.loss == "vespo" else None)
    assert skipped["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-5)
    for name, delta in full_delta.items():
        assert torch.allclose(skipped_delta[name], delta, atol=1e-6), name
    assert skipped["tokens"] == full["tokens"]


@pytest.mark.parametrize("layout", [collate, collate_prefix])
def test_rows_with_no_policy_token_are_skipped_too(model, layout):
    """A masked truncated completion (mask_truncated) has an advantage but no token in the loss: not run."""
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="dapo"), max_tokens=8))
    batch = _batch(model, [0.0, 1.3, 0.0, -0.7, 0.9, 0.0, 2.0, -1.1], layout)
    policy = torch.ones_like(batch.completion_mask)
    policy[[1, 4]] = 0.0
    batch = dataclasses.replace(batch, policy_mask=policy)
    full, full_delta = _step(model, batch, loss_fn, skip=False)
    skipped, skipped_delta = _step(model, batch, loss_fn, skip=True)
    assert full["rows_skipped"] == 0 and skipped["rows_skipped"] == 5
    assert skipped["loss"] == pytest.approx(full["loss"], abs=1e-6)
    for name, delta in full_delta.items():
        assert torch.allclose(skipped_delta[name], delta, atol=1e-6), name


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
        policy_update(
            trained, optimizer, informative, loss_fn, UpdateOptions(skip_zero_advantage=skip)
        )  # moments now non-zero
        before = {n: p.detach().clone() for n, p in trained.named_parameters()}
        policy_update(trained, optimizer, idle, loss_fn, UpdateOptions(skip_zero_advantage=skip))
        updates.append({n: p.detach() - before[n] for n, p in trained.named_parameters()})
    assert any(bool((d != 0).any()) for d in updates[0].values())  # AdamW did move on zero gradients
    for name, delta in updates[0].items():
        assert torch.allclose(updates[1][name], delta, atol=1e-7), name


def test_only_built_in_losses_without_kl_or_an_entropy_share_are_marked_inert():
    assert not builtin_loss(dataclasses.replace(AlgorithmConfig(), kl_coef=0.1), max_tokens=8).zero_advantage_inert
    # (the entropy quantile is taken over every row's tokens: a row left out would move it)
    assert not builtin_loss(AlgorithmConfig(top_entropy_quantile=0.2), max_tokens=8).zero_advantage_inert
    assert not LiveCode("loss", "loss", "def loss(*a): ...", "cell").zero_advantage_inert


def test_clip_fraction_at_the_sequence_level_is_the_share_of_sequences_clipped(model):
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo", ratio_level="sequence"), max_tokens=8))
    batch = _batch(model, [1.0, -1.0, 0.5, -0.5, 2.0, -2.0, 1.0, -1.0])
    with torch.no_grad():
        mask = batch.loss_mask
        lr = ((batch.logprobs(model) - batch.old_logprobs) * mask).sum(1) / mask.sum(1)
        adv = batch.advantages
        out = ((lr.exp() > 1.05) & (adv > 0)) | ((lr.exp() < 0.95) & (adv < 0))
        expected = out.float().mean()  # as TRL counts it: each sequence once
    trained = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.0)
    sequence = policy_update(
        trained, optimizer, batch, loss_fn, UpdateOptions(clip=(0.05, 0.05), ratio_level="sequence")
    )[0]
    assert sequence["clip_fraction"] == pytest.approx(expected.item(), abs=1e-6)
    assert 0 < expected < 1


def test_each_loss_counts_its_own_clip():
    assert AlgorithmConfig(loss="dapo").metric_clip == (0.2, 0.28)
    assert AlgorithmConfig(loss="grpo", clip_high=0.3).metric_clip == (0.2, 0.3)
    assert AlgorithmConfig(loss="cispo", rho_max=5.0).metric_clip == (1.0, 4.0)  # weights capped at 5, as TRL counts
    assert AlgorithmConfig(loss="sapo").metric_clip[1] == float("inf")  # no clip: 0


@pytest.mark.parametrize("split", [ONE_RANK, Split(micro_batch_tokens=12)], ids=["one pass", "two passes"])
def test_a_loss_that_names_entropies_gets_a_copy_of_the_whole_batchs_even_without_the_metric(model, split):
    seen = []

    def loss(logprobs, old_logprobs, advantages, mask, entropies):
        seen.append(masked_mean(entropies, mask).item())
        entropies.zero_()  # its own copy: the metric keeps the values
        return grpo_loss(logprobs, old_logprobs, advantages, mask)

    batch = _batch(model, [1.0, -1.0, 0.5, -0.5, 0.2, -0.2])
    plain = compile_function(builtin_loss(AlgorithmConfig(), max_tokens=8))
    sgd = lambda m: torch.optim.SGD(m.parameters(), lr=1.0)  # noqa: E731
    trained = copy.deepcopy(model)
    reference = policy_update(trained, sgd(trained), batch, plain, UpdateOptions(split=split, with_entropy=True))[0]
    trained = copy.deepcopy(model)
    metrics = policy_update(trained, sgd(trained), batch, loss, UpdateOptions(split=split, with_entropy=False))[0]
    assert metrics["micro_batches"] == reference["micro_batches"] == (1 if split is ONE_RANK else 6)
    assert reference["entropy"] > 0 and seen == [pytest.approx(reference["entropy"], rel=1e-6)]
    assert metrics["entropy"] == pytest.approx(reference["entropy"], rel=1e-6)
