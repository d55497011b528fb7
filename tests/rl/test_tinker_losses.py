"""Tinker's built-in losses equal Tinker's own definitions (the "implemented as" snippet of each page of
tinker-docs.thinkingmachines.ai/tinker/losses, written out below per datum), values and gradients, to 1e-5."""

from __future__ import annotations

import pytest
import torch

from forge_nb.rl import tinker_losses
from forge_nb.rl.target_batch import Datums


def by_hand(name: str, target_logprobs, sampling_logprobs, advantages, weights, config) -> torch.Tensor:
    """One datum's loss, as Tinker's docs write it (1-D tensors of its N positions)."""
    if name == "cross_entropy":
        return -(target_logprobs * weights).sum()
    prob_ratio = torch.exp(target_logprobs - sampling_logprobs)
    if name == "importance_sampling":
        return -(prob_ratio * advantages).sum()
    if name == "ppo":
        clipped_ratio = torch.clamp(prob_ratio, config["clip_low_threshold"], config["clip_high_threshold"])
        ppo_objective = torch.min(prob_ratio * advantages, clipped_ratio * advantages)
        return -ppo_objective.sum()
    if name == "cispo":
        clipped_ratio = torch.clamp(prob_ratio, config["clip_low_threshold"], config["clip_high_threshold"])
        return -(clipped_ratio.detach() * target_logprobs * advantages).sum()
    if name == "dro":
        quadratic_term = (target_logprobs - sampling_logprobs) ** 2
        return -(target_logprobs * advantages - 0.5 * config["beta"] * quadratic_term).sum()
    raise AssertionError(name)


CASES = [
    ("cross_entropy", {}),
    ("importance_sampling", {}),
    ("ppo", {}),
    ("ppo", {"clip_low_threshold": 0.9, "clip_high_threshold": 1.05}),
    ("cispo", {}),
    ("cispo", {"clip_low_threshold": 0.5, "clip_high_threshold": 1.1}),
    ("dro", {"beta": 0.05}),
]


def _batch(seed: int = 0):
    """Three datums of 5, 3 and 7 positions: logprobs, sampler logprobs off by up to ~0.7 (ratios well outside
    the clip), advantages and weights of either sign (a custom loss's weights are -dC/dlogprobs)."""
    gen = torch.Generator().manual_seed(seed)
    lengths = [5, 3, 7]
    rows = []
    for n in lengths:
        lp = -torch.rand(n, generator=gen, dtype=torch.float64) * 3
        rows.append(
            {
                "logprobs": lp,
                "sampling": lp + 0.7 * torch.randn(n, generator=gen, dtype=torch.float64),
                "advantages": torch.randn(n, generator=gen, dtype=torch.float64),
                "weights": torch.randn(n, generator=gen, dtype=torch.float64),
            }
        )
    return rows


@pytest.mark.parametrize(("name", "config"), CASES, ids=[f"{n}-{c}" if c else n for n, c in CASES])
def test_each_loss_and_its_gradient_equal_tinkers_definition(name, config):
    rows = _batch()
    full = {**{k: v for k, v in tinker_losses.LOSSES[name].config.items() if v is not None}, **config}
    # by hand, datum by datum
    leaves = [r["logprobs"].clone().requires_grad_(True) for r in rows]
    expected = sum(
        by_hand(name, leaf, r["sampling"], r["advantages"], r["weights"], full) for leaf, r in zip(leaves, rows)
    )
    expected.backward()
    # forge_nb's: right-padded [B, T], summed over the real positions
    width = max(len(r["logprobs"]) for r in rows)
    mask = torch.zeros(len(rows), width, dtype=torch.float64)

    def padded(key: str) -> torch.Tensor:
        out = torch.zeros(len(rows), width, dtype=torch.float64)
        for i, r in enumerate(rows):
            out[i, : len(r[key])] = r[key]
            mask[i, : len(r[key])] = 1
        return out

    logprobs = padded("logprobs").requires_grad_(True)
    inputs = {"logprobs": padded("sampling"), "advantages": padded("advantages"), "weights": padded("weights")}
    checked = tinker_losses.check_config(name, config)
    terms = tinker_losses.per_token(name, logprobs, inputs, checked)
    loss = tinker_losses.total(terms, mask)
    loss.backward()
    assert abs(loss.item() - expected.item()) <= 1e-5 * max(1.0, abs(expected.item()))
    for i, leaf in enumerate(leaves):
        assert torch.allclose(logprobs.grad[i, : len(leaf)], leaf.grad, atol=1e-5, rtol=1e-5)
        assert torch.all(logprobs.grad[i, len(leaf) :] == 0)  # padding has no gradient
    each = tinker_losses.per_datum(terms.detach(), mask)
    for i, (leaf, r) in enumerate(zip(leaves, rows)):
        one = by_hand(name, leaf.detach(), r["sampling"], r["advantages"], r["weights"], full)
        assert abs(each[i].item() - one.item()) <= 1e-5 * max(1.0, abs(one.item()))


def test_per_token_clip_thresholds_given_as_inputs_clip_each_token():
    logprobs = torch.log(torch.tensor([[2.0, 2.0]]))  # ratio 2 at both positions
    inputs = {
        "logprobs": torch.zeros(1, 2),
        "advantages": torch.ones(1, 2),
        "clip_low_threshold": torch.tensor([[0.8, 0.8]]),
        "clip_high_threshold": torch.tensor([[1.2, 1.5]]),
    }
    terms = tinker_losses.per_token("ppo", logprobs, inputs, {})
    assert torch.allclose(terms, torch.tensor([[-1.2, -1.5]]))


def test_cross_entropy_without_weights_counts_every_position():
    logprobs = torch.tensor([[-1.0, -2.0]])
    assert tinker_losses.per_token("cross_entropy", logprobs, {}, {}).tolist() == [[1.0, 2.0]]


@pytest.mark.parametrize(
    ("name", "config", "message"),
    [
        ("dro", {}, "loss_fn_config.beta: dro requires it"),
        ("ppo", {"clip_eps": 0.2}, "loss_fn_config.clip_eps: not a setting of ppo"),
        ("importance_sampling", {"beta": 0.1}, "loss_fn_config.beta: not a setting of importance_sampling"),
        ("cispo", {"clip_low_threshold": "low"}, "loss_fn_config.clip_low_threshold: a number"),
    ],
)
def test_a_config_a_loss_does_not_take_is_refused_naming_the_key(name, config, message):
    with pytest.raises(ValueError, match=message):
        tinker_losses.check_config(name, config)


def test_datums_collate_right_padded_with_each_datums_inputs():
    datums = Datums([[5, 6, 7], [8]], [[6, 7, 2], [2]], {"weights": [[0.0, 1.0, 1.0], [0.5]]})
    batch = datums.collate(pad_id=0)
    assert batch.input_ids.tolist() == [[5, 6, 7], [8, 0, 0]]
    assert batch.target_ids.tolist() == [[6, 7, 2], [2, 0, 0]]
    assert batch.loss_mask.tolist() == [[1, 1, 1], [1, 0, 0]]
    assert batch.inputs["weights"].tolist() == [[0.0, 1.0, 1.0], [0.5, 0.0, 0.0]]
    assert batch.rows(torch.arange(6.0).reshape(2, 3)) == [[0.0, 1.0, 2.0], [3.0]]
    assert batch.select(torch.tensor([1])).input_ids.tolist() == [[8, 0, 0]]


def test_consecutive_datums_sharing_a_prefix_are_grouped():
    from forge_nb.rl.target_batch import MIN_SHARED, shared_prefixes

    prompt = list(range(3, 3 + MIN_SHARED + 2))
    tokens = [prompt + [1, 2], prompt + [1, 5, 6], prompt[:4] + [9], prompt + [7], prompt]
    # the first two share prompt + [1]; the third shares too little; the last two share prompt but the last keeps
    # one token of its own
    assert shared_prefixes(tokens) == [len(prompt) + 1, len(prompt) + 1, 4, len(prompt) - 1, len(prompt) - 1]
    assert shared_prefixes([prompt + [1], [5] * 12]) is None


def test_a_shared_prefix_runs_once_with_the_plain_layouts_logprobs_and_gradients():
    """Up to float rounding: Llama's RMSNorm computes in float32 whatever the model's dtype, so the two layouts'
    gradients differ in float32's last bits (as tests/rl/test_prefix_batch.py's prompt-once layout does)."""
    from transformers import AutoModelForCausalLM

    from forge_nb.models import BUNDLED_MODEL
    from forge_nb.rl.target_batch import SharedPrefixBatch, TargetBatch

    model = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
    gen = torch.Generator().manual_seed(3)
    tokens, targets, weights = [], [], []
    for p in range(2):  # 2 prompts x 3 samples of varied length, then one datum alone
        prompt = [1] + torch.randint(3, 15, (9 + p,), generator=gen).tolist()
        for i in range(3):
            seq = prompt + torch.randint(3, 15, (1 + 2 * i,), generator=gen).tolist() + [2]
            tokens.append(seq[:-1])
            targets.append(seq[1:])
    tokens.append([1, 4, 5, 6])
    targets.append([4, 5, 6, 2])
    weights = [torch.randn(len(t), generator=gen).tolist() for t in tokens]
    datums = Datums(tokens, targets, {"weights": weights})
    shared, plain = datums.collate(0), datums.collate(0, share_prefixes=False)
    assert isinstance(shared, SharedPrefixBatch) and isinstance(plain, TargetBatch)
    assert shared.prompt_ids.shape[0] == 3 and shared.completion_ids.shape[1] < plain.input_ids.shape[1]
    out = []
    for batch in (shared, plain):
        model.zero_grad()
        logprobs = batch.logprobs(model)
        tinker_losses.total(
            tinker_losses.per_token("cross_entropy", logprobs, batch.inputs, {}), batch.loss_mask
        ).backward()
        out.append((logprobs.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}))
    torch.testing.assert_close(out[0][0], out[1][0], rtol=1e-5, atol=1e-5)
    for name, grad in out[0][1].items():  # each parameter's gradient, as a whole
        assert (grad - out[1][1][name]).norm() <= 1e-4 * out[1][1][name].norm(), name  # measured: <= 2.2e-5
    picked = shared.select(torch.tensor([4, 6]))  # rows of one prompt and the datum alone: their prefixes only
    assert picked.prompt_ids.shape[0] == 2
    torch.testing.assert_close(picked.logprobs(model).detach(), out[1][0][[4, 6]], rtol=1e-5, atol=1e-5)
