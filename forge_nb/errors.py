"""The error a session raises when it cannot do what was asked: not up, an actor that failed to start, a call
refused. Its own module, so that a client (a kernel, a script) can raise and catch it without importing the
controller's modules (torch, Monarch)."""

from __future__ import annotations


class SessionError(RuntimeError):
    """The session cannot do what was asked (not up, an actor failed to start, a call refused, ...)."""


class SessionDown(SessionError):
    """A session's server answers, but its session is not up: it is going down (or came down) while the server
    lives on for a moment. A client's `is_up` reads it as False."""
