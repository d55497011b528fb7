"""The judge role: judge-model actors, started when a reward that asks one is first checked.

One judge actor per model, each in a proc of its own ("judge" for the first model, "judge-2", ...):
started by `serve` when the checker reports that a candidate reward asked a judge that is not
running, then attached to every proc that runs rewards (the reward workers, the checker; again
after either is replaced), replaced when a call to it timed out or failed or when Monarch reports
its proc dead (`respawn`, as every role is: `fleet.recovery`), and stopped with the mesh. A batch
that a judge could not answer is scored again once the judge runs (`Fleet.score`), so
a judge lost mid-run (or not yet started, after a resume) costs time, not samples. The judge
traffic the reward procs measure comes back with their scores (`Scores.judge`) and goes to the
metrics stream as one "judge" row per scored batch (`observe`), for the dashboard.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import psutil

from forge_nb.actors.base import ActorInfo
from forge_nb.actors.judge import JudgeActor, JudgeSpec
from forge_nb.checks import CheckFailed
from forge_nb.config import Config
from forge_nb.fleet.checker import JudgeNeeded
from forge_nb.rewards.batch import Scores
from forge_nb.rewards.verdicts import JudgeStats
from forge_nb.runtime.calls import wait

if TYPE_CHECKING:
    from forge_nb.fleet.fleet import Fleet

ROLE = "judge"


class JudgePool:
    """Judge actors by model name, and who may ask them."""

    def __init__(self, fleet: Fleet, config: Config) -> None:
        self.fleet = fleet
        # The plan gives judges no GPU ("cpu" on a host that has some): `launch.placement`.
        self.dtype, self.device = config.model.dtype, fleet.placement.device(ROLE, config.model.device)
        self.threads = config.mesh.threads_per_proc
        self.actors: dict[str, Any] = {}  # model -> judge actor mesh
        self.infos: dict[str, list[ActorInfo]] = {}
        self.proc_names: dict[str, str] = {}  # model -> its proc mesh's name
        self.emit: Callable[..., Any] | None = None
        self._lock = threading.RLock()  # a cell's check and a background run's scoring may both start one

    def connect(self, metrics) -> None:
        """Send "judge" rows to `metrics` (the session's `MetricsStream`)."""
        self.emit = metrics.emit

    def serve(self, call: Callable[[], Any], attempts: int = 3) -> Any:
        """`call()` (a check or a rescore in the checker); when it asked judges that could not answer,
        start (or replace) them and call again -> its result. `CheckFailed` if a judge cannot start."""
        for attempt in range(attempts):
            try:
                return call()
            except JudgeNeeded as e:
                if attempt == attempts - 1:
                    raise CheckFailed(str(e)) from None
                for model, problem in e.problems.items():
                    self.fix(model, problem)
        raise AssertionError("unreachable")

    def fix(self, model: str, problem: str) -> None:
        """A judge "not running" is started (or attached where it was missing); one that "timed out"
        or "failed" is replaced."""
        with self._lock:
            if model not in self.actors:
                self.start(model)
            elif problem == "not running":
                self.attach_everywhere(model)
            else:
                self.replace(model, f"a call to it {problem}")

    def start(self, model: str) -> None:
        """Start a judge actor for `model` and attach it everywhere; `CheckFailed` if it cannot start."""
        with self._lock:
            taken = len(self.proc_names)
            name = self.proc_names.setdefault(model, f"{ROLE}-{taken + 1}" if taken else ROLE)
            actor = self.fleet.mesh.spawn(name, JudgeActor, self._spec(model))
            try:
                infos = list(wait(actor.ready.call()).values())
            except Exception as e:
                self.fleet.mesh.stop_role(name)
                raise CheckFailed(f"the judge model {model!r} failed to start: {e}") from None
            self._use(model, actor, infos)
            self.fleet.on_event(ROLE, f"started for {model!r}: procs {[i.pid for i in infos]}")

    def replace(self, model: str, why: str) -> None:
        """Fresh procs for `model`'s judge (a call to it hung or its proc died), attached everywhere."""
        with self._lock:
            old = [i.pid for i in self.infos.get(model, []) if i.hostname == socket.gethostname()]
            actor = self.fleet.mesh.replace(self.proc_names[model], JudgeActor, self._spec(model), old)
            self._use(model, actor, list(wait(actor.ready.call()).values()))
            self.fleet.on_event(ROLE, f"{model!r} procs {old} replaced by {self.pids(model)}: {why}")

    def attach(self, reward_workers: Any) -> None:
        """Give `reward_workers` (an actor mesh, e.g. fresh reward procs) every judge."""
        if self.actors:
            wait(reward_workers.attach_judges.call(dict(self.actors)))

    def attach_everywhere(self, model: str) -> None:
        handle = {model: self.actors[model]}
        wait(self.fleet.rewards.attach_judges.call(handle))
        self.fleet.checker.attach_judges(handle)

    def observe(self, step: int, scores: list[Scores]) -> bool:
        """After a batch was scored: its judge traffic as one "judge" row, and judges that could not
        answer started or replaced -> whether every one of those now runs (then the caller scores the
        batch again; otherwise its samples stay failed, saying why, and the run goes on)."""
        traffic = sum((s.judge for s in scores), JudgeStats())
        if traffic.calls and self.emit is not None:
            self.emit("judge", step=step, models=",".join(sorted(self.actors)), **traffic.row())
        problems = {model: problem for s in scores for model, problem in s.judge_problems.items()}
        restored = bool(problems)
        for model, problem in problems.items():
            try:
                self.fix(model, problem)
            except Exception as e:
                self.fleet.on_event(ROLE, f"could not restore the judge {model!r} ({problem}): {e}")
                restored = False
        return restored

    def respawn(self, cause: str) -> None:
        """Monarch reported a judge proc dead (`fleet.recovery.Recovery.heal`): replace the judges
        whose procs are gone (every judge when some of its procs run on another host, out of sight)."""
        with self._lock:
            for model, infos in list(self.infos.items()):
                here = [i.pid for i in infos if i.hostname == socket.gethostname()]
                if len(here) < len(infos) or not all(_running(pid) for pid in here):
                    self.replace(model, f"respawned after {cause}")

    def pids(self, model: str) -> list[int]:
        return [i.pid for i in self.infos.get(model, [])]

    def _spec(self, model: str) -> JudgeSpec:
        return JudgeSpec(model, self.dtype, self.device, self.threads)

    def _use(self, model: str, actor: Any, infos: list[ActorInfo]) -> None:
        self.actors[model], self.infos[model] = actor, infos
        self.fleet.info[ROLE] = [i for infos in self.infos.values() for i in infos]
        self.attach_everywhere(model)


def _running(pid: int) -> bool:
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False
