"""Reward actor: scores samples with the live reward set. A mesh of them shares a batch.

Members are per-sample or batched (`rewards.forms`); a `Judge` among them asks the judge actors the
session attached (`attach_judges`), and the time it waits on them does not count against the
reward timeout (`live.deadline`).
"""

from __future__ import annotations

import dataclasses
import threading
from dataclasses import dataclass

from monarch.actor import endpoint

import forge_nb.rewards.judge_client as judge_client
from forge_nb.actors.base import ForgeActor
from forge_nb.live.capture import compile_function
from forge_nb.live.deadline import start_thread, wait_for
from forge_nb.live.registry import Member
from forge_nb.rewards.batch import RewardBatch, Scores
from forge_nb.rewards.scoring import score_members


@dataclass(frozen=True)
class RewardSpec:
    """The reward set a worker starts with (named members with weights), its version, and the
    per-sample, per-member timeout (s)."""

    members: dict[str, Member]
    version: int
    timeout_s: float
    threads: int = 1


class RewardWorker(ForgeActor):
    """Holds one compiled reward set; swaps to a new one between batches."""

    role = "reward"

    def __init__(self, spec: RewardSpec) -> None:
        self._begin(spec.threads)
        self.timeout_s = spec.timeout_s
        self._use(spec.members, spec.version)
        self._ready()

    def _use(self, members: dict[str, Member], version: int) -> None:
        self.fns = {name: compile_function(m.code) for name, m in members.items()}
        self.weights, self.version = {name: m.weight for name, m in members.items()}, version

    @endpoint
    def set_rewards(self, members: dict[str, Member], version: int) -> int:
        """Compile and make reward set `version` live for the next batch -> the version now live."""
        self._use(members, version)
        return self.version

    @endpoint
    def attach_judges(self, handles: dict) -> list[str]:
        """Judge actors by model name, for the `Judge` rewards this proc runs -> the models attached."""
        return judge_client.attach(handles)

    @endpoint
    def score(self, batch: RewardBatch) -> Scores:
        """Score every sample with every member; a sample a member fails on is marked (which member,
        why), never silently scored 0.

        The batch runs in a worker thread: past `timeout_s` x samples x members the unscored samples
        are marked timed out and the actor answers with ``timed_out`` set; a thread cannot be killed,
        so the session then replaces this proc (`Fleet.replace_rewards`).
        """
        fns, weights, version = self.fns, self.weights, self.version
        components = {name: [None] * len(batch) for name in fns}
        errors: dict[int, str] = {}
        judges: dict[str, str] = {}
        done = threading.Event()
        before = judge_client.stats()

        def run() -> None:
            try:
                judges.update(score_members(fns, batch, components, errors))
            finally:
                done.set()

        thread = start_thread(run, "forge_nb-reward")
        finished = wait_for(done, self.timeout_s * max(1, len(batch)) * len(fns), thread)
        traffic = {"judge": judge_client.stats() - before, "judge_problems": dict(judges)}
        if finished:
            return dataclasses.replace(Scores.combine(components, weights, errors, version), **traffic)
        # The hung thread may still write: answer with a snapshot.
        components = {name: list(values) for name, values in components.items()}
        errors = dict(errors)
        for i in range(len(batch)):
            if i not in errors and any(values[i] is None for values in components.values()):
                errors[i] = f"did not return within the {self.timeout_s:g} s per-sample timeout"
        scores = Scores.combine(components, weights, errors, version)
        return dataclasses.replace(scores, timed_out=True, **traffic)

    # -- diagnostics: for tests and debugging, never on the training path ----------------------

    @endpoint
    def version_live(self) -> int:
        return self.version
