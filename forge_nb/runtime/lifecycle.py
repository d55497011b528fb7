"""Lifecycle: the sessions this process holds, and what happens to each at interpreter exit.

A session whose controller runs in this process (`Session`) is stopped, so no proc outlives its controller. A
client of a session's server (`server.client.SessionClient`) detaches, leaving the session to its server -- or
takes it down, when it started it from a script (`forge_nb.up(persist=False)`, a script's default).
"""

from __future__ import annotations

import atexit
import weakref
from typing import Protocol


class Held(Protocol):
    def down(self) -> None: ...

    def at_exit(self) -> None:
        """What the session does when this process exits (`down`, or a client's detach)."""
        ...


_live: weakref.WeakSet = weakref.WeakSet()
_current: weakref.ref | None = None


def register(session: Held) -> None:
    """Track `session` as the current one and (re)register the exit hook last, so it runs before Monarch's own
    exit handlers (atexit runs last-registered first; Monarch registers its own as the mesh starts)."""
    global _current
    _live.add(session)
    _current = weakref.ref(session)
    atexit.unregister(stop_all)
    atexit.register(stop_all)


def unregister(session: Held) -> None:
    _live.discard(session)


def live_sessions() -> list[Held]:
    return list(_live)


def current() -> Held | None:
    """The session started or attached last, if this process still holds it."""
    session = _current() if _current is not None else None
    return session if session in _live else None


def stop_all() -> None:
    """Each session this process holds does what it does at exit (called at exit; safe to call any time)."""
    for session in list(_live):
        try:
            session.at_exit()
        except Exception as e:  # at exit there is no one to raise to; say what failed
            print(f"forge_nb: ending a session at exit failed: {e}")
