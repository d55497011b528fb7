"""Reward actor: scores completions with the task's exact verifier. A mesh of them shares a batch."""

from __future__ import annotations

import math
import os

from monarch.actor import Actor, endpoint

from forge_nb.config import TaskConfig
from forge_nb.tasks import make_task


class RewardWorker(Actor):
    """Scores (completion, target) pairs. `reward_version` 0 is the task's built-in verifier."""

    def __init__(self, task: TaskConfig, seed: int) -> None:
        self.task = make_task(task.name, seed, max_digits=task.max_digits, eval_size=task.eval_size)
        self.reward_version = 0

    @endpoint
    def score(self, completions: list[str], targets: list[str]) -> tuple[list[float], int]:
        """-> (one finite float per completion, the reward version that produced them)."""
        rewards = [float(self.task.verify(c, t)) for c, t in zip(completions, targets)]
        bad = [i for i, r in enumerate(rewards) if not math.isfinite(r)]
        if bad:
            raise ValueError(f"reward v{self.reward_version} returned a non-finite value for samples {bad}")
        return rewards, self.reward_version

    @endpoint
    def pid(self) -> int:
        return os.getpid()
