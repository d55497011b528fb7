"""Deadlines for live code that leave out the time it spends waiting on a judge actor or for a CPU.

A reward's timeout guards against code that hangs or spins; a model judge is legitimately slow and
has a deadline of its own (`Judge.timeout_s`). So the seconds a proc's threads spend blocked on
judge calls (`rewards.judge_client.blocked`) are added back to the budget, and the deadline never
passes while a judge call is in flight. Likewise the seconds the code's thread sat runnable in the
kernel's run queue while other processes had the cores (Linux's per-thread schedstat): on a loaded
2-core machine a reward that returns at once can wait that long, and it did not hang.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

import forge_nb.rewards.judge_client as judge_client

_POLL_S = 0.05  # how often a wait looks at the judge clock while a judge call is in flight


def start_thread(target: Callable[[], None], name: str) -> int:
    """Run `target` in a daemon thread -> its native thread id (for `wait_for`)."""
    thread = threading.Thread(target=target, name=name, daemon=True)
    thread.start()
    return thread.native_id or 0


def run_queue_s(thread: int) -> float:
    """Seconds thread `thread` (a native id in this process) has waited runnable for a CPU; 0 where
    the kernel does not say (not Linux, no schedstat) or the thread has ended."""
    try:
        with open(f"/proc/self/task/{thread}/schedstat") as f:
            return int(f.read().split()[1]) / 1e9
    except (OSError, IndexError, ValueError):
        return 0.0


def wait_for(done: threading.Event, budget_s: float | None, thread: int = 0) -> bool:
    """Wait until `done` is set or the code running in native thread `thread` has used `budget_s`
    seconds of its own (not waiting on a judge or for a CPU) -> whether done. `budget_s` None waits for ever."""
    if budget_s is None:
        return done.wait()
    start = time.monotonic()
    _, blocked_at_start = judge_client.blocked()
    queued_at_start = run_queue_s(thread)
    while True:
        in_flight, blocked = judge_client.blocked()
        excused = blocked - blocked_at_start + run_queue_s(thread) - queued_at_start
        remaining = budget_s - (time.monotonic() - start - excused)
        if remaining <= 0 and not in_flight:
            return done.is_set()
        # With judges attached, look at the clock often: a judge call may start (or end) meanwhile.
        step = _POLL_S if in_flight else min(remaining, _POLL_S) if judge_client.attached() else remaining
        if done.wait(step):
            return True
