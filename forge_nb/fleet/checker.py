"""The checker role: candidate rewards and losses run in a proc of their own, never in the kernel.

Each check has a deadline; a check that outlives it (code that hangs or spins) gets its proc
replaced, so nothing keeps burning a core, and fails with a message saying so. A reward check keeps
its deadline in the checker's proc, which leaves out the time spent waiting on a judge actor; the
kernel waits a little longer (`JUDGE_SLACK_S` longer once judges run) for a proc too wedged to answer.
A check that asked a judge that is not running (or did not answer) raises `JudgeNeeded`, for
`fleet.judges.JudgePool` to start (or replace) it and check again.
"""

from __future__ import annotations

import socket
from collections.abc import Callable

from forge_nb.actors.base import ActorInfo
from forge_nb.actors.live_check import CheckResult, LiveCheck, LiveCheckSpec
from forge_nb.checks import CheckFailed
from forge_nb.launch.local import LocalMesh
from forge_nb.live.capture import LiveCode
from forge_nb.live.registry import Member
from forge_nb.live.validate import LossProbe
from forge_nb.rewards.batch import RewardSample, Scores
from forge_nb.runtime.calls import wait

ROLE = "live_check"
# Past its timeout, how long the kernel waits for the checker to answer. A reward that hangs or spins is caught by
# the checker's own deadline (which leaves out the time its thread waited for a CPU or on a judge) and answers
# "timed out" at once; this wait is only for a checker that cannot answer at all (a C call that holds the GIL, a
# proc that died). It also covers what comes before the deadline starts: unpickling the candidate, which imports
# the module of a reward defined in one, and the proc waiting for a CPU, which on a loaded 2-core machine takes
# seconds: a short slack replaced checkers that were only slow.
ANSWER_SLACK_S = 30.0
JUDGE_SLACK_S = 600.0  # ... once judge actors run (each judge call has its own deadline, `Judge.timeout_s`)


class JudgeNeeded(CheckFailed):
    """The code asked judges that could not answer: `problems` maps model -> "not running",
    "timed out" or "failed"."""

    def __init__(self, message: str, problems: dict[str, str]) -> None:
        super().__init__(message)
        self.problems = problems


class Checker:
    """Calls the `LiveCheck` actor with a deadline; replaces its proc when one passes."""

    def __init__(self, mesh: LocalMesh, threads: int, on_replace: Callable[[str], None] | None = None) -> None:
        self.mesh, self.spec = mesh, LiveCheckSpec(threads)
        self.judges: dict = {}  # judge actors by model (`attach_judges`), also given to replacements
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

    def attach_judges(self, handles: dict) -> None:
        """Let the rewards checked here ask these judge actors (by model name), now and after a replacement."""
        self.judges = {**self.judges, **handles}
        wait(self.actor.attach_judges.call(handles))

    def check_reward(self, code: LiveCode, samples: list[RewardSample], timeout: float) -> list[float]:
        """The candidate's value on every sample, or `CheckFailed` naming what went wrong."""
        slack = JUDGE_SLACK_S if self.judges else ANSWER_SLACK_S
        result: CheckResult = self._wait(self.actor.check_reward.call_one(code, samples, timeout), timeout, slack)
        if result.timed_out:
            self.replace(f"a check ran past its {timeout:g} s timeout")
            raise CheckFailed(f"{result.error}; the process that ran it was replaced")
        if result.judge_problems:
            raise JudgeNeeded(result.error, result.judge_problems)
        return self._result(result).values

    def check_loss(self, code: LiveCode, probe: LossProbe, has_reference: bool, timeout: float) -> float:
        """The candidate's value on the probe batch (forward and backward ran), or `CheckFailed`."""
        return self._result(self._wait(self.actor.check_loss.call_one(code, probe, has_reference), timeout)).values[0]

    def score(self, members: dict[str, Member], samples: list[RewardSample], timeout: float) -> Scores:
        """A reward set's scores of `samples` (for what-if rescoring), or `CheckFailed` on a timeout."""
        scores: Scores = self._wait(
            self.actor.score.call_one(members, samples), timeout, JUDGE_SLACK_S if self.judges else 0.0
        )
        if scores.judge_problems:
            raise JudgeNeeded(f"judges could not answer: {scores.judge_problems}", scores.judge_problems)
        return scores

    @staticmethod
    def _result(result: CheckResult) -> CheckResult:
        if result.error is not None:
            raise CheckFailed(result.error)
        return result

    def _wait(self, future, timeout: float, slack: float = 0.0):
        try:
            return wait(future, timeout + slack)
        except TimeoutError:
            self.replace(f"a check ran past its {timeout:g} s timeout")
            raise CheckFailed(
                f"did not return within the {timeout:g} s timeout (hangs?); the process that ran it was replaced"
            ) from None

    def replace(self, why: str) -> None:
        """Fresh checker procs (the judges attached to the old ones attached to them too)."""
        spec = LiveCheckSpec(self.spec.threads, self.judges)
        self.actor = self.mesh.replace(ROLE, LiveCheck, spec, self.pids)
        self.ready()
        self.replaced += 1
        self.on_replace(why)
