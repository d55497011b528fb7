"""Run a function in a fresh Python process (multiprocessing's spawn): for sessions that must be the first
Monarch use of their process (a mesh over several hosts listens on TCP, and Monarch fixes a process's
transport at its first use), while the test process may already have run local meshes."""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import resource_tracker
from typing import Any


def in_fresh_process(fn: Callable[..., Any], *args: Any, timeout: float = 900.0) -> Any:
    """`fn(*args)` in a new process -> its result (its exception is raised here); the process has exited
    when this returns. `fn` and its arguments must pickle (a module-level function)."""
    try:
        with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
            return pool.submit(fn, *args).result(timeout)
    finally:
        # spawn starts multiprocessing's resource tracker, a child that would outlive the test (and fail the
        # suite's no-process-left checks); nothing of it is needed once the process has exited.
        resource_tracker._resource_tracker._stop()
