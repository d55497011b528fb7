"""The checker role: candidate rewards and losses run in a proc of their own, never in the kernel.

Each check has a deadline; a check that outlives it (code that hangs or spins) gets its proc
replaced, so nothing keeps burning a core, and fails with a message saying so. A fresh checker is
started lazily for the next check.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from forge_nb.actors.base import ActorInfo
from forge_nb.actors.live_check import CheckResult, LiveCheck, LiveCheckSpec
from forge_nb.live.capture import LiveCode
from forge_nb.live.registry import Member
from forge_nb.live.validate import CheckFailed, LossProbe
from forge_nb.mesh.calls import wait
from forge_nb.mesh.local import LocalMesh
from forge_nb.rewards.batch import RewardSample, Scores

ROLE = "live_check"


class Checker:
    """Calls the `LiveCheck` actor with a deadline; replaces its proc when one passes."""

    def __init__(self, mesh: LocalMesh, threads: int, on_replace: Callable[[str], None] | None = None) -> None:
        self.mesh, self.spec = mesh, LiveCheckSpec(threads)
        self.on_replace = on_replace or (lambda why: None)
        self.actor = mesh.spawn(ROLE, LiveCheck, self.spec)
        self.info: list[ActorInfo] = []
        self.replaced = 0

    def ready(self) -> list[ActorInfo]:
        """Wait for the checker's constructor -> who answered."""
        self.info = list(wait(self.actor.ready.call()).values())
        return self.info

    @property
    def pids(self) -> list[int]:
        """The checker's pids on this host (those a replacement may have to kill)."""
        return [i.pid for i in self.info if i.hostname == socket.gethostname()]

    def check_reward(self, code: LiveCode, samples: list[RewardSample], timeout: float) -> list[float]:
        """The candidate's value on every sample, or `CheckFailed` naming what went wrong."""
        return self._result(self.actor.check_reward.call_one(code, samples), timeout).values

    def check_loss(self, code: LiveCode, probe: LossProbe, has_reference: bool, timeout: float) -> float:
        """The candidate's value on the probe batch (forward and backward ran), or `CheckFailed`."""
        return self._result(self.actor.check_loss.call_one(code, probe, has_reference), timeout).values[0]

    def score(self, members: dict[str, Member], samples: list[RewardSample], timeout: float) -> Scores:
        """A reward set's scores of `samples` (for what-if rescoring), or `CheckFailed` on a timeout."""
        return self._wait(self.actor.score.call_one(members, samples), timeout)

    def _result(self, future, timeout: float) -> CheckResult:
        result: CheckResult = self._wait(future, timeout)
        if result.error is not None:
            raise CheckFailed(result.error)
        return result

    def _wait(self, future, timeout: float):
        try:
            return wait(future, timeout)
        except TimeoutError:
            self.replace(f"a check ran past its {timeout:g} s timeout")
            raise CheckFailed(
                f"did not return within the {timeout:g} s timeout (hangs?); the process that ran it was replaced"
            ) from None

    def replace(self, why: str) -> None:
        self.actor = self.mesh.replace(ROLE, LiveCheck, self.spec, self.pids)
        self.ready()
        self.replaced += 1
        self.on_replace(why)
