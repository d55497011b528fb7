"""The probe batch a candidate loss is validated on, built from real recent episodes."""

from __future__ import annotations

import torch

from forge_nb.live.validate import LossProbe
from forge_nb.rl.episode import Episode


def loss_probe(episodes: list[Episode]) -> LossProbe:
    """Per-token tensors [B, T] of the episodes' completions (T = longest), advantages [B]."""
    width = max(len(e.logprobs) for e in episodes)
    logprobs = torch.zeros(len(episodes), width)
    mask = torch.zeros(len(episodes), width)
    for i, e in enumerate(episodes):
        logprobs[i, : len(e.logprobs)] = torch.tensor(e.logprobs)
        mask[i, : len(e.logprobs)] = 1.0
    advantages = torch.tensor([e.advantage for e in episodes], dtype=torch.float32)
    # old_logprobs slightly off the current ones, so ratio-based losses see ratios != 1 as in training
    old = (logprobs - 0.05 * mask).detach()
    ref = (logprobs - 0.1 * mask).detach()
    return LossProbe(logprobs, old, advantages, mask, ref)
