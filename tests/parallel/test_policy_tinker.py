"""A policy's Tinker calls: forward_backward's gradient is, for each built-in loss, the gradient of Tinker's own
definition computed by hand through the model (1e-5); gradients accumulate over calls, apart from the session's
own steps; optim_step is AdamW with Tinker's hyperparameters; a gang of 2 ranks takes the 1-rank steps."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import TrainerConfig
from forge_nb.models import BUNDLED_MODEL
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.policy import AdamStep, Policy, PolicySpec
from forge_nb.rl.target_batch import Datums
from forge_nb.testing.gang import run_gang
from tests.rl.test_tinker_losses import CASES, by_hand


def datums(seed: int = 0, n: int = 4, shared: bool = False) -> Datums:
    """`n` datums of varied length, targets the inputs shifted by one (plus a last token), sampler logprobs
    near the model's, advantages and weights of either sign; `shared`: pairs of datums continue one prompt of
    10 tokens (an RL client's group: its prefix runs once, `rl.target_batch.SharedPrefixBatch`)."""
    gen = torch.Generator().manual_seed(seed)
    tokens, targets, inputs = [], [], {"logprobs": [], "advantages": [], "weights": []}
    prompt = []
    for i in range(n):
        if not shared or i % 2 == 0:
            prompt = [1] + torch.randint(3, 15, (9 if shared else 3 + 2 * i,), generator=gen).tolist()
        seq = prompt + torch.randint(3, 15, (1 + i,), generator=gen).tolist()
        tokens.append(seq[:-1])
        targets.append(seq[1:])
        length = len(seq) - 1
        inputs["logprobs"].append((-2.5 + 0.5 * torch.randn(length, generator=gen)).tolist())
        inputs["advantages"].append(torch.randn(length, generator=gen).tolist())
        inputs["weights"].append(torch.randn(length, generator=gen).tolist())
    return Datums(tokens, targets, inputs)


def for_loss(d: Datums, name: str) -> Datums:
    keep = ("weights",) if name == "cross_entropy" else ("logprobs", "advantages")
    return Datums(d.tokens, d.targets, {k: v for k, v in d.inputs.items() if k in keep})


def policy(budget: int = 0, lr: float = 1e-3, world: int = 1, dtype: str = "float64") -> Policy:
    """The bundled model's policy; in float64 by default: a batch and its datums one by one then agree within the
    1e-5 compared (in float32 they differ by up to ~6e-5 on gradients of ~10: another summation order; Llama's
    RMSNorm still computes in float32, so float64 narrows the gap, it does not close it)."""
    gang = Gang.join(torch.device("cpu"), 60.0) if world > 1 else Gang()
    config = TrainerConfig(micro_batch_tokens=budget)
    return Policy(PolicySpec(BUNDLED_MODEL, dtype, "cpu", 0, 1.0, config, world > 1, lr), gang)


def by_hand_gradients(model, d: Datums, name: str, config: dict) -> tuple[dict[str, torch.Tensor], list[float]]:
    """Each datum alone through `model`, its logprobs of its targets, Tinker's formula, summed, backward ->
    (each parameter's gradient, each datum's logprobs)."""
    model.zero_grad(set_to_none=True)
    total, logprobs = 0.0, []
    for i, (tokens, targets) in enumerate(zip(d.tokens, d.targets)):
        logits = model(input_ids=torch.tensor([tokens])).logits[0]
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(targets)[:, None])[:, 0]
        logprobs.append(lp.detach().tolist())
        row = {k: torch.tensor(v[i], dtype=lp.dtype) for k, v in d.inputs.items()}
        total = total + by_hand(name, lp, row.get("logprobs"), row.get("advantages"), row.get("weights"), config)
    total.backward()
    return {n: p.grad.clone() for n, p in model.named_parameters()}, logprobs


@pytest.fixture(scope="module")
def reference_model():
    return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float64)


@pytest.mark.parametrize(("name", "config"), CASES, ids=[f"{n}-{c}" if c else n for n, c in CASES])
@pytest.mark.parametrize(
    ("budget", "shared"),
    [(0, False), (40, False), (0, True), (30, True)],
    ids=["one-pass", "micro-batches", "shared-prefixes", "shared-micro-batches"],
)
def test_forward_backward_gradient_equals_tinkers_loss_by_hand(name, config, budget, shared, reference_model):
    from forge_nb.rl import tinker_losses

    full = {**{k: v for k, v in tinker_losses.LOSSES[name].config.items() if v is not None}, **config}
    d = for_loss(datums(shared=shared), name)
    assert hasattr(d.collate(0), "prompt_of") == shared  # the layout the parameter names
    p = policy(budget)
    logprobs, losses = p.forward_backward(d, name, tinker_losses.check_config(name, config))
    expected, expected_logprobs = by_hand_gradients(copy.deepcopy(reference_model), d, name, full)
    got = dict(zip([n for n, q in p.model.named_parameters() if q.requires_grad], p.accumulated))
    assert set(got) == set(expected)
    for n, g in got.items():
        torch.testing.assert_close(g, expected[n], rtol=1e-5, atol=1e-5, msg=n)
    for mine, theirs in zip(logprobs, expected_logprobs):
        assert mine == pytest.approx(theirs, abs=1e-5)
    assert all(q.grad is None for q in p.model.parameters())  # kept apart from .grad until optim_step


def test_gradients_accumulate_over_calls_and_a_session_step_between_leaves_them():
    d = for_loss(datums(n=4), "importance_sampling")
    first = Datums(d.tokens[:2], d.targets[:2], {k: v[:2] for k, v in d.inputs.items()})
    second = Datums(d.tokens[2:], d.targets[2:], {k: v[2:] for k, v in d.inputs.items()})
    merged, split = policy(lr=0.0), policy(lr=0.0)  # (the session's step must not move the weights either)
    merged.forward_backward(d, "importance_sampling", {})
    split.forward_backward(first, "importance_sampling", {})
    _session_step(split)  # the notebook trains meanwhile: its own gradients, zeroed by its update
    split.forward_backward(second, "importance_sampling", {})
    for a, b in zip(merged.accumulated, split.accumulated):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


def _session_step(p: Policy) -> None:
    from forge_nb.rl.batch import TrainBatch
    from forge_nb.rl.losses import grpo_loss

    batch = TrainBatch([[1, 3, 4]] * 2, [[5, 2], [6, 2]], [[-2.0, -2.0]] * 2, [1.0, -1.0])
    p.update(batch, grpo_loss, 1.0, lambda loss: loss, False)


def test_optim_step_is_adamw_with_tinkers_hyperparameters_and_clip(reference_model):
    step = AdamStep(learning_rate=1e-3, beta1=0.8, beta2=0.9, eps=1e-7, weight_decay=0.1, grad_clip_norm=0.5)
    d = for_loss(datums(), "cross_entropy")
    p = policy(lr=123.0)  # the session's learning rate: Tinker's step sets its own
    p.forward_backward(d, "cross_entropy", {})
    metrics = p.optim_step(step)
    model = copy.deepcopy(reference_model)
    grads, _ = by_hand_gradients(model, d, "cross_entropy", {})
    norm = torch.sqrt(sum((g.double() ** 2).sum() for g in grads.values()))
    assert metrics["grad_norm"] == pytest.approx(norm.item(), rel=1e-5)
    for q in model.parameters():
        q.grad.mul_(min(1.0, 0.5 / (norm.item() + 1e-6)))
    adam = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.8, 0.9), eps=1e-7, weight_decay=0.1)
    adam.step()
    for (n, mine), theirs in zip(p.model.named_parameters(), model.parameters()):
        torch.testing.assert_close(mine, theirs, rtol=1e-5, atol=1e-6, msg=n)
    assert p.accumulated is None  # spent


def tinker_steps(rank: int, world: int) -> dict:
    """On each rank: two forward_backwards (ppo, then cross_entropy) and an optim_step, twice (float32). The
    budget of 20 tokens packs each call's 4 datums (padded to 10) into 2 micro-batches: 1 rank runs both, 2 ranks
    one each, over the same rows (the same rounding), as tests/parallel/test_policy.py compares them."""
    p = policy(budget=20, world=world, dtype="float32")
    out = {"losses": [], "norms": []}
    for step in range(2):
        _, ppo = p.forward_backward(for_loss(datums(step), "ppo"), "ppo", {})
        _, ce = p.forward_backward(for_loss(datums(10 + step), "cross_entropy"), "cross_entropy", {})
        out["losses"].append(ppo + ce)
        # eps 1e-8, the cookbook's: at Tinker's default 1e-12 a coordinate whose gradient is ~1e-12 moves by +-lr
        # on the sign of its last bits, which the ranks' sums in another order may flip
        step = AdamStep(learning_rate=1e-3, eps=1e-8, grad_clip_norm=1.0)
        out["norms"].append(p.optim_step(step)["grad_norm"])
        out.setdefault("weights", []).append({n: t.clone() for n, t in p.whole_published()})
    return out


def test_two_ranks_take_the_one_rank_tinker_steps():
    """Losses and gradient norms agree to 1e-5 relative at both steps, and every weight after the first to 1e-5.
    The two forward_backwards of a step add their gradients in another order on 2 ranks (each backward's
    reduce-scatter adds to the sharded gradient) than on 1 (micro-batch after micro-batch): last bits, which
    AdamW's division by the root of the second moment makes up to ~5e-5 on the weights after the second step."""
    (one,) = run_gang(1, tinker_steps)
    two = run_gang(2, tinker_steps)[0]
    for a, b in zip(two["losses"], one["losses"]):
        assert a == pytest.approx(b, rel=1e-5, abs=1e-5)
    assert two["norms"] == pytest.approx(one["norms"], rel=1e-5)
    for step, bound in enumerate((1e-5, 1e-4)):
        after = two["weights"][step].items()
        assert max((w - one["weights"][step][n]).abs().max().item() for n, w in after) <= bound, step
