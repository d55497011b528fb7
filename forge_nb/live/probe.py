"""Probe batches for validating live code, built from real recent episodes."""

from __future__ import annotations

import torch

from forge_nb.live.validate import LossProbe, RewardProbe
from forge_nb.rl.episode import Episode


def reward_context(e: Episode, step: int) -> dict:
    """What a reward sees besides (prompt, completion, target): the training state of the sample."""
    return {"step": step, "policy_version": e.policy_version, "sample_id": e.sample_id, "prompt_id": e.prompt_id}


def reward_probes(episodes: list[Episode], step: int) -> list[RewardProbe]:
    return [RewardProbe(e.prompt, e.completion, e.target, reward_context(e, step)) for e in episodes]


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
    return LossProbe(logprobs, old, advantages, mask)
