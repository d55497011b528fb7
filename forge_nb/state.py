"""What a run is made of in the kernel, beside its actors: one `RunState`, owned by the session.

The step (`forge_nb.step`) reads it and moves it on (counters, buffer, metrics); checkpoints write it
and read it back (`forge_nb.run.checkpoints`); the mesh keeps its policy versions current
(`fleet.weight_sync.WeightSync` writes `versions`).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from forge_nb.config import Config
from forge_nb.engines.base import SamplingParams
from forge_nb.errors import SessionError  # noqa: F401 -- where the session's modules take it from
from forge_nb.metrics import MetricsStream
from forge_nb.rl.replay import ReplayBuffer
from forge_nb.run.rollout_log import RolloutLog
from forge_nb.run.tracking import Trackers, make_trackers
from forge_nb.tasks.base import Task
from forge_nb.tasks.prompts import PromptFormat
from forge_nb.versions import PolicyVersions


@dataclass
class RunState:
    """The task stream, the replay buffer, the metrics stream, counters and policy versions of one run,
    and where its batches are logged. `prompts` is set once the tokenizer is loaded."""

    config: Config
    task: Task
    metrics: MetricsStream = field(default_factory=MetricsStream)
    buffer: ReplayBuffer = field(default_factory=ReplayBuffer)
    versions: PolicyVersions = field(default_factory=PolicyVersions)
    step_count: int = 0  # trained batches
    rollout_count: int = 0  # rollouts made: each samples with a seed of its own
    next_sample_id: int = 0
    next_eval: int = 0  # the step count at which `eval.every` evaluates next
    reward_errors: list[dict] = field(default_factory=list)
    prompts: PromptFormat | None = None
    rollout_log: RolloutLog | None = None
    trackers: Trackers = field(default_factory=lambda: Trackers([]))
    external: Any = None  # `agents.external.ExternalAgents` once `s.endpoint()` started one
    _unsubscribe: Callable[[], None] | None = field(default=None, repr=False)

    def __post_init__(self) -> None:
        self.next_eval = self.next_eval or self.config.eval.every

    def sampling(self, n: int | None = None, temperature: float | None = None) -> SamplingParams:
        """The sampling of the next rollout: G samples per prompt, a seed of its own."""
        seed = self.config.seed * 1_000_003 + self.rollout_count
        return self.config.engine.sampling(n or self.config.algorithm.group_size, seed, temperature)

    def eval_due(self) -> bool:
        """Whether `eval.every` trained steps have passed since the last evaluation (and schedule the next)."""
        every = self.config.eval.every
        if not every or self.step_count < self.next_eval:
            return False
        self.next_eval = (self.step_count // every + 1) * every
        return True

    def open_logs(self, run_dir: Path, run_id: str) -> None:
        """The rollout log and the trackers the config turns on, in the run directory (before any proc
        starts: a tracker that cannot start fails `up` at once)."""
        log = self.config.log
        try:
            trackers = make_trackers(log, run_dir, self.config.to_dict(), run_id)
        except Exception as e:
            raise SessionError(f"forge_nb: a tracker the config turns on (log.*) did not start: {e}") from e
        self.trackers = Trackers(trackers)
        if log.samples:
            self.rollout_log = RolloutLog(run_dir / "rollouts", log.max_mb)
        if self.trackers:
            self._unsubscribe = self.metrics.subscribe(self.trackers.on_row)

    def close_logs(self) -> None:
        if self.rollout_log is not None:
            self.rollout_log.close()
        if self.trackers:
            if self._unsubscribe is not None:
                self._unsubscribe()
            self.trackers.close()
            self.trackers = Trackers([])


def new_run_dir(config: Config, token: int) -> tuple[str, Path]:
    """A new run's id (time, pid, `token`) and its directory: under `log.dir`, else $FORGE_NB_RUNS,
    else ./forge_runs."""
    run_id = time.strftime("%Y%m%d-%H%M%S") + f"-{os.getpid()}-{token % 10_000:04d}"
    return run_id, Path(config.log.dir or os.environ.get("FORGE_NB_RUNS") or "forge_runs") / run_id
