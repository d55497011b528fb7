"""Waiting on Monarch futures from the kernel.

A Jupyter kernel runs an asyncio loop on its main thread, and Monarch warns (on every call) when
`Future.get()` blocks inside a running loop. The session's calls are synchronous by design -- a
cell waits for its step -- so when a loop is running in this thread, the wait moves to a helper
thread that has none; elsewhere (scripts, the background run) it is a plain `get()`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

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


def leader(answers: Any) -> Any:
    """Rank 0's answer of a call to every proc of a gang (a `ValueMesh`), or a single answer as it is."""
    return answers.values()[0] if hasattr(answers, "values") and callable(answers.values) else answers


def on_gang(actors: Any, endpoint: str, *args: Any) -> Any:
    """Call `endpoint` on every proc of a gang's actor mesh (in a gang each call is a collective every
    rank must enter) and wait -> rank 0's answer."""
    return leader(wait(getattr(actors, endpoint).call(*args)))
