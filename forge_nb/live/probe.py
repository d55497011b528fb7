"""Probe batches for validating live code, built from real recent episodes."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import torch

from forge_nb.live.validate import LossProbe, RewardProbe
from forge_nb.rl.episode import Episode


def reward_context(e: Episode, step: int) -> dict:
    """What a reward sees besides (prompt, completion, target): the training state of the sample."""
    return {"step": step, "policy_version": e.policy_version, "sample_id": e.sample_id, "prompt_id": e.prompt_id}


def reward_probes(episodes: list[Episode], step: int) -> list[RewardProbe]:
    return [RewardProbe(e.prompt, e.completion, e.target, reward_context(e, step)) for e in episodes]


@dataclass(frozen=True)
class RewardBatch:
    """A batch to score, as columns (one entry per sample): far cheaper to send to an actor than
    one object per sample. `probes()` expands it on the receiving side."""

    prompts: list[str]
    completions: list[str]
    targets: list[str]
    policy_versions: list[int]
    sample_ids: list[int]
    prompt_ids: list[str]
    step: int

    def __len__(self) -> int:
        return len(self.prompts)

    def shard(self, part: slice) -> RewardBatch:
        columns = (self.prompts, self.completions, self.targets, self.policy_versions, self.sample_ids, self.prompt_ids)
        return RewardBatch(*(c[part] for c in columns), step=self.step)

    def probes(self) -> Iterator[RewardProbe]:
        for i in range(len(self)):
            context = {"step": self.step, "policy_version": self.policy_versions[i],
                       "sample_id": self.sample_ids[i], "prompt_id": self.prompt_ids[i]}  # fmt: skip
            yield RewardProbe(self.prompts[i], self.completions[i], self.targets[i], context)


def reward_batch(episodes: list[Episode], step: int) -> RewardBatch:
    return RewardBatch(
        [e.prompt for e in episodes], [e.completion for e in episodes], [e.target for e in episodes],
        [e.policy_version for e in episodes], [e.sample_id for e in episodes], [e.prompt_id for e in episodes], step,
    )  # fmt: skip


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
