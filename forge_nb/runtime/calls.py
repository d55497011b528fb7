"""Waiting on Monarch futures from the kernel.

A Jupyter kernel runs an asyncio loop on its main thread, and Monarch warns (on every call) when
`Future.get()` blocks inside a running loop. The session's calls are synchronous by design -- a
cell waits for its step -- so when a loop is running in this thread, the wait moves to a helper
thread that has none; elsewhere (scripts, the background run) it is a plain `get()`.
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from forge_nb.parallel.gang import GangError

_waiter = ThreadPoolExecutor(max_workers=4, thread_name_prefix="forge_nb-wait")

#: Checks a wait runs every `WATCH_EVERY_S` while it blocks: each returns an error to raise instead of waiting
#: on (a host of the mesh that is gone: `mesh.hosts.PlacedMesh.watch`), or None.
_watchers: list[Callable[[], Exception | None]] = []
WATCH_EVERY_S = 2.0


def watch(check: Callable[[], Exception | None]) -> None:
    """Run `check` while any wait blocks (until `unwatch`)."""
    _watchers.append(check)


def unwatch(check: Callable[[], Exception | None]) -> None:
    if check in _watchers:
        _watchers.remove(check)


def wait(future: Any, timeout: float | None = None) -> Any:
    """The result of a Monarch `Future` (its exception is raised here; `TimeoutError` after
    `timeout` s, the call going on where it runs; a watcher's error when one reports, see `watch`)."""
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return _get(future, timeout)
    return _waiter.submit(_get, future, timeout).result()


def _get(future: Any, timeout: float | None) -> Any:
    """`future.get(timeout)`, in slices of `WATCH_EVERY_S` while watchers are set (a Monarch future may be
    waited on again after a timeout: the call goes on), each slice followed by the watchers' checks."""
    if not _watchers:
        return future.get(timeout)
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        left = None if deadline is None else deadline - time.monotonic()
        if left is not None and left <= 0:
            raise TimeoutError(f"no answer in {timeout} s")
        try:
            return future.get(WATCH_EVERY_S if left is None else min(WATCH_EVERY_S, left))
        except TimeoutError:
            for check in list(_watchers):
                error = check()
                if error is not None:
                    raise error from None


def shards(items: int, procs: int) -> list[slice]:
    """Contiguous, nearly equal slices of `items` for up to `procs` procs (none empty)."""
    chunk = -(-items // procs)
    return [slice(i * chunk, (i + 1) * chunk) for i in range(procs) if i * chunk < items]


_replicas: dict[int, tuple[Any, list[Any]]] = {}


def replica(mesh: Any, index: int, procs: int) -> Any:
    """Proc `index` of an actor mesh of `procs` procs, for `call_one`: the mesh itself when it has one
    proc, else its slice, made once per mesh (a slice costs ~1 ms to build: on every step it was a
    measurable share of the orchestration)."""
    if procs == 1:
        return mesh
    kept = _replicas.get(id(mesh))
    if kept is None or kept[0] is not mesh:  # a replaced role's new mesh may reuse a freed id
        kept = _replicas[id(mesh)] = (mesh, [mesh.slice(procs=i) for i in range(procs)])
    return kept[1][index]


class GangFuture:
    """Every rank's answer to one call of a gang, from one future per rank: `get` returns them in rank order
    and raises a rank's failure as soon as it arrives. A call to the whole actor mesh (`.call()`) answers
    only when every rank has: with one rank hung (SIGSTOP, a wedged driver) its peers' collectives timed
    out in `trainer.collective_timeout_s`, and the call still waited ~60 s, until Monarch gave the hung
    proc up. `straggler_s`: when some ranks answered and the others give no answer that many seconds
    later, `GangError` (a call that runs no collective, such as a step on a batch of zero advantages, gives
    the hung rank's peers nothing to time out on). Waitable as a Monarch future is (`wait`): `get(timeout)`
    may be called again after a `TimeoutError`, the answers already in are kept."""

    POLL_S = 0.05  # while several ranks are out, a failure of any is seen within about this times their count

    def __init__(self, futures: list[Any], what: str = "", straggler_s: float | None = None) -> None:
        self._futures, self._what, self._straggler_s = futures, what, straggler_s
        self._answers: dict[int, Any] = {}
        self._first_answer: float | None = None  # monotonic s
        self.issued = time.time()  # when the messages went (`fleet.recovery`: was the gang restarted since?)

    def get(self, timeout: float | None = None) -> list[Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        while out := self._out():
            for i in out:  # every rank out is tried once before a deadline is checked (a `get(0)` polls)
                try:
                    self._answers[i] = self._futures[i].get(self._turn(deadline))
                except TimeoutError:
                    continue
                if self._first_answer is None:
                    self._first_answer = time.monotonic()
            if self._out():
                self._check(deadline, timeout)
        return [self._answers[i] for i in range(len(self._futures))]

    def _out(self) -> list[int]:
        """The ranks that have not answered yet."""
        return [i for i in range(len(self._futures)) if i not in self._answers]

    def _ends(self, deadline: float | None) -> list[float]:
        return [t for t in (deadline, self._straggler_deadline()) if t is not None]

    def _turn(self, deadline: float | None) -> float | None:
        """How long to wait on one rank that has not answered (None: until it does)."""
        ends = self._ends(deadline)
        left = max(0.0, min(ends) - time.monotonic()) if ends else None
        # the last rank out waits whole; several take turns, so that one's failure is not waited behind another's hang
        return left if len(self._out()) == 1 else self.POLL_S if left is None else min(self.POLL_S, left)

    def _check(self, deadline: float | None, timeout: float | None) -> None:
        """`TimeoutError` past `deadline`, `GangError` past the stragglers' deadline."""
        now = time.monotonic()
        if deadline is not None and now >= deadline:
            raise TimeoutError(f"no answer in {timeout} s")
        straggler = self._straggler_deadline()
        if straggler is not None and now >= straggler:
            out, answered = self._out(), sorted(self._answers)
            raise GangError(
                f"rank {', '.join(map(str, out))} gave no answer to {self._what} {self._straggler_s:g} s after rank "
                f"{', '.join(map(str, answered))} did: its proc died, or hangs outside any collective"
            )

    def _straggler_deadline(self) -> float | None:
        if self._straggler_s is None or self._first_answer is None:
            return None
        return self._first_answer + self._straggler_s


_sending = threading.Lock()


def gang_call(actors: Any, endpoint: str, *args: Any, straggler_s: float | None = None) -> GangFuture:
    """Call `endpoint` on every proc of a gang's actor mesh (in a gang each call is a collective every rank
    must enter), a message to each -> the `GangFuture` of their answers (`straggler_s`: see there). The
    messages of one call are sent under one lock: two threads' calls (an async run's reference logprobs
    and its train step, a cell's checksums) reach every rank in the same order, as one cast each did."""
    procs = actors.size()
    with _sending:
        futures = [getattr(replica(actors, i, procs), endpoint).call_one(*args) for i in range(procs)]
    return GangFuture(futures, endpoint, straggler_s)


def on_gang(actors: Any, endpoint: str, *args: Any, straggler_s: float | None = None) -> Any:
    """`gang_call`, waited on -> rank 0's answer (the one that answers for the gang)."""
    return wait(gang_call(actors, endpoint, *args, straggler_s=straggler_s))[0]
