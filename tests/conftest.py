"""Shared fixtures: one local session per module, and the check that nothing is left running."""

from __future__ import annotations

import time

import psutil
import pytest


def child_processes() -> list[psutil.Process]:
    """Live (non-zombie) descendants of this test process."""
    alive = []
    for p in psutil.Process().children(recursive=True):
        try:
            if p.status() != psutil.STATUS_ZOMBIE:
                alive.append(p)
        except psutil.NoSuchProcess:
            pass
    return alive


def wait_no_children(timeout: float = 10.0) -> list[psutil.Process]:
    """Wait up to `timeout` s for every descendant to exit -> those still alive."""
    deadline = time.monotonic() + timeout
    while (left := child_processes()) and time.monotonic() < deadline:
        time.sleep(0.1)
    return left


@pytest.fixture(scope="module")
def session():
    """A real local mesh with the bundled model (small batch to keep tests quick)."""
    import forge_nb

    s = forge_nb.up(prompts_per_step=4, group_size=4, threads_per_proc=1)
    yield s
    s.down()
    assert wait_no_children() == []
