"""The env role: procs that run agent rollouts, started when a rollout is first set.

One `EnvWorker` per reward proc count (`mesh.reward_procs`), each attached to the generator replicas;
a batch's rows are split over them and their trajectories put back in row order. A batch that runs
past `agent.batch_timeout_s` replaces the env procs (a Python thread or coroutine that hangs cannot be
stopped otherwise) and fails with a clear error; the step is not taken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from forge_nb.actors.env import AgentCode, EnvSpec, EnvWorker
from forge_nb.agents.trajectory import Trajectory
from forge_nb.engines.base import SamplingParams
from forge_nb.runtime.calls import replica, shards, wait

if TYPE_CHECKING:
    from forge_nb.fleet.fleet import Fleet

ROLE = "env"


class AgentTimeout(RuntimeError):
    """Agent rollouts ran past their timeout; the env procs were replaced."""


class EnvPool:
    """The env procs of a session (none until `start`), the live rollout they run, and the calls on them."""

    def __init__(self, fleet: Fleet, spec: EnvSpec, procs: int, timeout_s: float) -> None:
        self.fleet, self.spec, self.procs, self.timeout_s = fleet, spec, procs, timeout_s
        self.actors: Any = None
        self.live: tuple[AgentCode, int] | None = None

    @property
    def running(self) -> bool:
        return self.actors is not None

    def start(self) -> None:
        """Spawn the env procs and attach them to the generators (once; again after a replacement)."""
        old = self.fleet.local_pids(ROLE) if self.actors is not None else []
        spawn = self.fleet.mesh.replace if old else self.fleet.mesh.spawn
        args = (ROLE, EnvWorker, self.spec, old) if old else (ROLE, EnvWorker, self.spec)
        self.actors = spawn(*args, procs=self.procs)
        self.fleet.info[ROLE] = list(wait(self.actors.ready.call()).values())
        self.attach_generator()
        if self.live is not None:
            wait(self.actors.set_rollout.call(*self.live))

    def attach_generator(self) -> None:
        if self.actors is not None:
            wait(self.actors.attach_generator.call(self.fleet.generator, self.fleet.generator_procs))

    def set_rollout(self, agent: AgentCode | None, version: int) -> None:
        """Make `agent` live as `version` in every env proc (starting them the first time); None: the
        step generates one completion per sample again (the env procs stay, idle)."""
        if agent is not None:
            if self.actors is None:
                self.start()
            wait(self.actors.set_rollout.call(agent, version))
        self.live = None if agent is None else (agent, version)

    def rollouts(
        self, rows: list[dict], group_size: int, sampling: SamplingParams, context: dict, agent: AgentCode | None = None
    ) -> list[Trajectory]:
        """G trajectories per row, row-major (`Trajectory.group` indexes `rows`), from the live rollout or
        from candidate `agent` (checked without making it live)."""
        if self.actors is None:
            self.start()
        parts = shards(len(rows), self.procs)
        futures = [
            replica(self.actors, i, self.procs).rollouts.call_one(rows[p], group_size, sampling, context, agent)
            for i, p in enumerate(parts)
        ]
        trajectories = []
        try:
            for part, future in zip(parts, futures):
                for t in wait(future, self.timeout_s):
                    t.group += part.start
                    trajectories.append(t)
        except TimeoutError:
            self.start()
            what = f"agent rollouts ran past agent.batch_timeout_s={self.timeout_s:g} s: procs replaced"
            self.fleet.on_event(ROLE, what)
            raise AgentTimeout(
                f"agent rollouts of step {context.get('step')} did not finish within agent.batch_timeout_s="
                f"{self.timeout_s:g} s; the env procs were replaced and no step was taken"
            ) from None
        return trajectories
