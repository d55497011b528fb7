"""Live-check actor: runs candidate rewards and losses on probe batches, in a proc of its own.

The kernel never runs live code: a candidate that hangs or spins would leave a thread burning a core
in it for as long as it lives (a Python thread cannot be killed). Here it is the checker's proc that
is stopped and replaced when a check outlives its timeout (`mesh.roles.Roles.check`).
"""

from __future__ import annotations

from dataclasses import dataclass

from monarch.actor import endpoint

from forge_nb.actors.base import ForgeActor
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.registry import Member
from forge_nb.live.validate import (
    CheckFailed,
    LossProbe,
    describe_exception,
    score_members,
    validate_loss,
    validate_reward,
)
from forge_nb.rewards.batch import RewardSample, Scores
from forge_nb.rl.train_step import needs_ref


@dataclass(frozen=True)
class LiveCheckSpec:
    threads: int = 1


@dataclass(frozen=True)
class CheckResult:
    """What a check found: `error` is None when the code passed (then `values` are its outputs)."""

    error: str | None
    values: list[float] | None = None


class LiveCheck(ForgeActor):
    """Compiles live code and runs it on probe batches; holds nothing between calls."""

    role = "live_check"

    def __init__(self, spec: LiveCheckSpec) -> None:
        self._begin(spec.threads)
        self._ready()

    @endpoint
    def check_reward(self, code: LiveCode, samples: list[RewardSample]) -> CheckResult:
        """Compile `code` and score every probe sample; the first bad value or exception is the error."""
        try:
            return CheckResult(None, validate_reward(_compile(code), samples, timeout=None))
        except CheckFailed as e:
            return CheckResult(str(e))

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
        score_members(fns, samples, components, errors)
        return Scores.combine(components, {n: m.weight for n, m in members.items()}, errors, -1)


def _compile(code: LiveCode):
    try:
        return compile_function(code)
    except CheckFailed:
        raise
    except Exception as e:
        raise CheckFailed(describe_exception(e)) from None
