import math

import torch

from forge_nb.rl.losses import grpo_loss, masked_mean


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_advantage():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss = grpo_loss(logprobs, logprobs.detach(), adv, mask)
    # ratio 1 everywhere: per-sequence means are -1 and +2 -> mean 0.5
    assert math.isclose(loss.item(), 0.5)
    loss.backward()
    # d/dlogp of -ratio*A averaged: seq 0 has 2 tokens (1/2 each), seq 1 one token; / 2 sequences
    expected = torch.tensor([[-0.25, -0.25], [1.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)


def test_ratio_is_clipped_for_positive_advantage():
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(2.0))  # ratio 2
    loss = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), clip_eps=0.2)
    assert math.isclose(loss.item(), -1.2, rel_tol=1e-6)


def test_ratio_is_not_clipped_when_it_makes_things_worse():
    # negative advantage with ratio 2: min(2 * -1, 1.2 * -1) = -2 -> loss 2
    loss = grpo_loss(torch.full((1, 1), math.log(2.0)), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert math.isclose(loss.item(), 2.0, rel_tol=1e-6)


def test_token_level_weights_every_token_equally():
    logprobs = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    # token-level: (-1 -1 -1 +1) / 4 = -0.5; sequence-level: (-1 + 1) / 2 = 0
    assert math.isclose(grpo_loss(logprobs, logprobs, adv, mask, token_level=True).item(), -0.5)
    assert math.isclose(grpo_loss(logprobs, logprobs, adv, mask).item(), 0.0)


def test_empty_mask_gives_zero_not_nan():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    loss = grpo_loss(logprobs, logprobs.detach(), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(logprobs.grad).all()
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0.0
