"""Reward actor: scores samples with the live reward version. A mesh of them shares a batch."""

from __future__ import annotations

import threading
from dataclasses import dataclass

from monarch.actor import endpoint

from forge_nb.actors.base import ForgeActor
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.validate import score_each
from forge_nb.rewards.batch import RewardBatch, Scores


@dataclass(frozen=True)
class RewardSpec:
    """The reward a worker starts with, its version, and the per-sample timeout (s)."""

    reward: LiveCode
    version: int
    timeout_s: float
    threads: int = 1


class RewardWorker(ForgeActor):
    """Holds one compiled reward version; swaps to a new one between batches."""

    role = "reward"

    def __init__(self, spec: RewardSpec) -> None:
        self._begin(spec.threads)
        self.fn, self.version, self.timeout_s = compile_function(spec.reward), spec.version, spec.timeout_s
        self._ready()

    @endpoint
    def set_reward(self, code: LiveCode, version: int) -> int:
        """Compile and make `version` live for the next batch -> the version now live."""
        self.fn, self.version = compile_function(code), version
        return self.version

    @endpoint
    def score(self, batch: RewardBatch) -> Scores:
        """Score every sample; a sample the reward fails on is marked, never silently scored 0.

        The batch runs in a worker thread: past `timeout_s` x batch size the unscored samples are
        marked timed out and the actor answers (a hung thread cannot be killed; it stays detached).
        """
        samples = list(batch.samples())
        scores = Scores([None] * len(samples), reward_version=self.version)
        fn, done = self.fn, threading.Event()

        def run() -> None:
            score_each(fn, samples, scores.rewards, scores.errors)
            done.set()

        threading.Thread(target=run, name="forge_nb-reward", daemon=True).start()
        if done.wait(self.timeout_s * max(1, len(samples))):
            return scores
        # The hung thread may still write into `scores`: answer with a snapshot.
        late = Scores(list(scores.rewards), dict(scores.errors), self.version)
        for i, r in enumerate(late.rewards):
            if r is None and i not in late.errors:
                late.errors[i] = f"did not return within the {self.timeout_s:g} s per-sample timeout"
        return late

    # -- diagnostics: for tests and debugging, never on the training path ----------------------

    @endpoint
    def version_live(self) -> int:
        return self.version
