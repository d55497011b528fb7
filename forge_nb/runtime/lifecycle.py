"""Lifecycle: every live session is stopped at interpreter exit, so no proc outlives its kernel."""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Stoppable(Protocol):
    def down(self) -> None: ...


_live: weakref.WeakSet = weakref.WeakSet()
_current: weakref.ref | None = None


def register(session: Stoppable) -> None:
    """Track `session` and (re)register the exit hook last, so it runs before Monarch's own
    exit handlers (atexit runs last-registered first; Monarch registers its own as the mesh starts)."""
    global _current
    _live.add(session)
    _current = weakref.ref(session)
    atexit.unregister(stop_all)
    atexit.register(stop_all)


def unregister(session: Stoppable) -> None:
    _live.discard(session)


def live_sessions() -> list[Stoppable]:
    return list(_live)


def current() -> Stoppable | None:
    """The session started last, if it is still up."""
    session = _current() if _current is not None else None
    return session if session in _live else None


def stop_all() -> None:
    """Stop every session still up (called at exit; safe to call any time)."""
    for session in list(_live):
        try:
            session.down()
        except Exception as e:  # at exit there is no one to raise to; say what failed
            print(f"forge_nb: stopping a session at exit failed: {e}")
