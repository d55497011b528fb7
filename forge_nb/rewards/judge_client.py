"""A proc's line to the judge actors: their handles by model, calls with a deadline, and a clock.

The session attaches the handles of its judge actors (`fleet.judges.JudgePool`) to every proc that
runs rewards (reward workers, the live-code checker); a `Judge` reward called there asks through
`ask`. Nothing here imports Monarch: a handle is whatever the session attached (an actor mesh whose
``verdicts`` endpoint answers `JudgeAnswer`).

The clock (`blocked`) lets the reward deadlines leave judge time out: a reward's own timeout guards
against code that hangs, while a judge call has its own deadline (`Judge.timeout_s`).
"""

from __future__ import annotations

import threading
import time
from typing import Any

from forge_nb.rewards.verdicts import JudgeAnswer, JudgeRequest, JudgeStats


class JudgeUnavailable(RuntimeError):
    """A judge could not answer: `problem` is "not running", "timed out" or "failed"."""

    def __init__(self, model: str, problem: str, detail: str = "") -> None:
        self.model, self.problem = model, problem
        super().__init__(f"judge {model!r} {problem}{': ' + detail if detail else ''}")


class JudgeNotRunning(JudgeUnavailable):
    """No judge actor serves `model` in this proc yet (the session starts one when it sees this)."""

    def __init__(self, model: str) -> None:
        super().__init__(model, "not running", "the session starts it when a reward that uses it is set")


_lock = threading.Lock()
_handles: dict[str, Any] = {}
_stats = JudgeStats()
_in_flight = 0
_blocked_s = 0.0


def attach(handles: dict[str, Any]) -> list[str]:
    """Use these judge actors from now on (by model name; added to those attached) -> the models."""
    with _lock:
        _handles.update(handles)
        return sorted(_handles)


def attached() -> bool:
    """Whether any judge actor is attached to this proc."""
    with _lock:
        return bool(_handles)


def ask(model: str, request: JudgeRequest, timeout_s: float) -> JudgeAnswer:
    """The judge for `model` on `request`, within `timeout_s` -> its answer, or `JudgeUnavailable`."""
    global _in_flight, _blocked_s, _stats
    with _lock:
        handle = _handles.get(model)
        if handle is None:
            raise JudgeNotRunning(model)
        _in_flight += 1
    start = time.perf_counter()
    try:
        answer: JudgeAnswer = handle.verdicts.call_one(request).get(timeout=timeout_s)
    except TimeoutError:
        raise JudgeUnavailable(model, "timed out", f"no answer within {timeout_s:g} s") from None
    except Exception as e:  # the judge's proc died, or its call raised
        raise JudgeUnavailable(model, "failed", f"{type(e).__name__}: {str(e)[:300]}") from None
    finally:
        waited = time.perf_counter() - start
        with _lock:
            _in_flight -= 1
            _blocked_s += waited
    with _lock:
        _stats += JudgeStats(1, len(request), waited, answer.seconds, answer.tokens)
    return answer


def stats() -> JudgeStats:
    """Judge traffic of this proc so far (subtract two snapshots for one batch's)."""
    with _lock:
        return _stats


def blocked() -> tuple[int, float]:
    """(judge calls in flight now, total seconds this proc's threads have waited on judges)."""
    with _lock:
        return _in_flight, _blocked_s
