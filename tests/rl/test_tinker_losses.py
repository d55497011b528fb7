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
