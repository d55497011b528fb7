"""Supervision: what Monarch reports when an actor or proc fails, kept for the session instead of
killing the kernel.

Monarch hands a failure nobody handled to ``monarch.actor.unhandled_fault_hook``, whose default
exits the main thread (in a kernel: a bare ``KeyboardInterrupt``). forge_nb installs a hook that
records the failure (`Fault`) and returns, so the session can see which role failed and replace it;
a role stopped on purpose (`expecting`), or an actor mesh stopped or replaced (`retire`), is not a fault.
"""

from __future__ import annotations

import contextlib
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import monarch.actor

# What a call on an actor whose proc died raises (Monarch 0.7 exports no public name for it).
from monarch._rust_bindings.monarch_hyperactor.supervision import SupervisionError  # noqa: F401

from forge_nb.runtime.calls import wait


@dataclass(frozen=True)
class Fault:
    """One failure Monarch reported: the mesh's name, the role it belongs to, and Monarch's report."""

    time: float
    mesh: str
    role: str
    message: str


class FaultLog:
    """Faults in order of arrival (thread-safe); `since(n)` returns those after the first n."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []
        self._expected: dict[str, int] = {}
        self._retired: set[str] = set()
        self._lock = threading.Lock()

    def record(self, mesh: str, message: str) -> None:
        role = mesh.split("-")[0]
        with self._lock:
            if self._expected.get(role) or mesh in self._retired:
                return
            self._faults.append(Fault(time.time(), mesh, role, message))

    def since(self, seen: int) -> list[Fault]:
        """The faults recorded after the first `seen`."""
        with self._lock:
            return self._faults[seen:]

    def __len__(self) -> int:
        with self._lock:
            return len(self._faults)

    def retire(self, mesh: str | None) -> None:
        """From now on a failure of actor mesh `mesh` (Monarch's name, `mesh_name`) is no fault: it was
        stopped or replaced. Monarch reports a proc that was killed ~10 s later, after the stop that killed
        it returned: that report restarted the role's new procs (or a later session's)."""
        if mesh:
            with self._lock:
                self._retired.add(mesh)

    @contextlib.contextmanager
    def expecting(self, role: str) -> Iterator[None]:
        """Failures of `role` in this block are its own stop, not faults."""
        role = role.split("-")[0]  # as `record` names it: "judge-2" is a "judge"
        with self._lock:
            self._expected[role] = self._expected.get(role, 0) + 1
        try:
            yield
        finally:
            with self._lock:
                self._expected[role] -= 1


FAULTS = FaultLog()


def mesh_name(actors: Any) -> str | None:
    """Monarch's name of an actor mesh as its failures give it (`MeshFailure.mesh_name`: the name it was
    spawned with and a suffix, "trainer-sKLowKFHCSB"); None if it cannot be read. Monarch 0.7 has no
    public accessor: it is the future in `ActorMesh._name`."""
    try:
        return str(wait(actors._name, 10.0))
    except Exception:
        return None


def _record(failure) -> None:
    """The hook: keep the failure (never raise: raising would take the kernel's main thread down)."""
    try:
        FAULTS.record(str(getattr(failure, "mesh_name", "unknown")), str(failure))
    except Exception:
        pass


def install() -> None:
    """Make forge_nb's hook the one Monarch calls (idempotent)."""
    monarch.actor.unhandled_fault_hook = _record
