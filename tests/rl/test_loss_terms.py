"""The pieces the built-in losses are made of (`forge_nb.rl.loss_terms`); the losses themselves: test_losses.py."""

import pytest
import torch

from forge_nb.rl.loss_terms import high_entropy_mask, quantile


def test_the_quantile_is_torchs():
    g = torch.Generator().manual_seed(0)
    for n in (1, 2, 21, 1001):
        values = torch.rand(n, generator=g)
        values[: n // 5] = 0.0  # ties (a token the policy is sure of has entropy 0)
        for q in (0.0, 0.05, 0.2, 0.5, 0.8, 0.95, 1.0):
            assert torch.isclose(quantile(values, q), torch.quantile(values, q), rtol=1e-6, atol=0), (n, q)
    assert quantile(torch.tensor([0.0] * 4 + [1.0] * 16 + [2.0]), 0.05) == 0  # 0.05 x 20 is 1 + 2e-16: on the 0
    with pytest.raises(ValueError, match="a quantile is in"):
        quantile(torch.ones(3), 1.5)


def test_the_high_entropy_mask_keeps_the_top_share_of_the_masked_tokens():
    entropies = torch.tensor([[0.1, 0.9, 0.5, 3.0], [0.7, 0.2, 0.3, 0.4]])
    mask = torch.tensor([[1.0, 1.0, 1.0, 0.0], [1.0, 1.0, 1.0, 1.0]])  # 3.0 is padding: never chosen
    kept = high_entropy_mask(entropies, mask, 0.25)  # of 7 tokens, above the 0.75 quantile (0.6): 0.9 and 0.7
    assert kept.tolist() == [[0.0, 1.0, 0.0, 0.0], [1.0, 0.0, 0.0, 0.0]]
    assert high_entropy_mask(entropies, torch.zeros_like(mask), 0.2).sum() == 0
