"""Live-check actor: runs candidate rewards and losses on probe batches, in a proc of its own.

The kernel never runs live code: a candidate that hangs or spins would leave a thread burning a core
in it for as long as it lives (a Python thread cannot be killed). Here it is the checker's proc that
is stopped and replaced when a check outlives its timeout (`fleet.checker.Checker`). The timeout is
kept here, where the time a reward waits on a judge actor can be left out of it (`live.deadline`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from monarch.actor import endpoint

import forge_nb.rewards.judge_client as judge_client
from forge_nb.actors.base import ForgeActor
from forge_nb.checks import CheckFailed, CheckTimedOut, describe_exception
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.registry import Member
from forge_nb.live.validate import LossProbe, validate_loss, validate_reward
from forge_nb.rewards.batch import RewardSample, Scores
from forge_nb.rewards.judge_client import JudgeUnavailable
from forge_nb.rewards.scoring import score_members
from forge_nb.rl.update import needs_ref


@dataclass(frozen=True)
class LiveCheckSpec:
    threads: int = 1
    judges: dict = field(default_factory=dict)  # judge actors by model, for rewards that ask one


@dataclass(frozen=True)
class CheckResult:
    """What a check found: `error` is None when the code passed (then `values` are its outputs).
    `timed_out`: it ran past its timeout (and may still run here); `judge_problems`: judges it asked
    that could not answer (model -> "not running", "timed out" or "failed")."""

    error: str | None
    values: list[float] | None = None
    timed_out: bool = False
    judge_problems: dict[str, str] = field(default_factory=dict)


class LiveCheck(ForgeActor):
    """Compiles live code and runs it on probe batches; holds nothing between calls."""

    role = "live_check"

    def __init__(self, spec: LiveCheckSpec) -> None:
        self._begin(spec.threads)
        judge_client.attach(spec.judges)
        self._ready()

    @endpoint
    def attach_judges(self, handles: dict) -> list[str]:
        """Judge actors by model name, for the rewards checked here -> the models attached."""
        return judge_client.attach(handles)

    @endpoint
    def check_reward(self, code: LiveCode, samples: list[RewardSample], timeout: float | None = None) -> CheckResult:
        """Compile `code` and score every probe sample within `timeout` s of its own time; the first
        bad value or exception is the error."""
        try:
            return CheckResult(None, validate_reward(_compile(code), samples, timeout))
        except CheckTimedOut as e:
            return CheckResult(str(e), timed_out=True)
        except CheckFailed as e:
            return CheckResult(str(e))
        except JudgeUnavailable as e:
            return CheckResult(str(e), judge_problems={e.model: e.problem})

    @endpoint
    def check_loss(self, code: LiveCode, probe: LossProbe, has_reference: bool) -> CheckResult:
        """Compile `code`, run it forward and backward on `probe` -> its value."""
        try:
            fn = _compile(code)
            if needs_ref(fn) and not has_reference:
                raise CheckFailed(
                    "the loss takes ref_logprobs, but no reference model runs: start the session with "
                    "algorithm.kl_coef > 0 (e.g. forge_nb.up(kl_coef=0.04))"
                )
            return CheckResult(None, [validate_loss(fn, probe, timeout=None)])
        except CheckFailed as e:
            return CheckResult(str(e))

    @endpoint
    def score(self, members: dict[str, Member], samples: list[RewardSample]) -> Scores:
        """Score `samples` with a reward set, as a reward worker would (for `Session.rescore`)."""
        fns = {name: _compile(m.code) for name, m in members.items()}
        components = {name: [None] * len(samples) for name in fns}
        errors: dict[int, str] = {}
        judges = score_members(fns, samples, components, errors)
        scores = Scores.combine(components, {n: m.weight for n, m in members.items()}, errors, -1)
        scores.judge_problems = judges
        return scores


def _compile(code: LiveCode):
    try:
        return compile_function(code)
    except CheckFailed:
        raise
    except Exception as e:
        raise CheckFailed(describe_exception(e)) from None
