"""Deadlines for live code that leave out the time it spends waiting on a judge actor.

A reward's timeout guards against code that hangs or spins; a model judge is legitimately slow and
has a deadline of its own (`Judge.timeout_s`). So the seconds a proc's threads spend blocked on
judge calls (`rewards.judge_client.blocked`) are added back to the budget, and the deadline never
passes while a judge call is in flight.
"""

from __future__ import annotations

import threading
import time

import forge_nb.rewards.judge_client as judge_client

_POLL_S = 0.05  # how often a wait looks at the judge clock while a judge call is in flight


def wait_for(done: threading.Event, budget_s: float | None) -> bool:
    """Wait until `done` is set or the code has used `budget_s` seconds of its own -> whether done.
    `budget_s` None waits for ever."""
    if budget_s is None:
        return done.wait()
    start = time.monotonic()
    _, blocked_at_start = judge_client.blocked()
    while True:
        in_flight, blocked = judge_client.blocked()
        remaining = budget_s - (time.monotonic() - start - (blocked - blocked_at_start))
        if remaining <= 0 and not in_flight:
            return done.is_set()
        # With judges attached, look at the clock often: a judge call may start (or end) meanwhile.
        step = _POLL_S if in_flight else min(remaining, _POLL_S) if judge_client.attached() else remaining
        if done.wait(step):
            return True
