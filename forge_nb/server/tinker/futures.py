"""Tinker's futures: every queued request gets a request id at once; `retrieve_future` waits for its result.

A result is JSON (a dict) or protobuf bytes (forward_backward's and a sample's); a request that failed has
Tinker's `RequestFailedResponse` instead (``{"error", "category"}``, "user" for the caller's mistake, "server"
for the session's), which the SDK raises as `RequestFailedError`. Results are kept until `KEEP_S` after they
were first read (the SDK may read one twice: a poll that timed out on its side), and a request id that was
never made, or whose result went, is unknown (404, which the SDK does not retry).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import itertools
import secrets
import threading
import time
from dataclasses import dataclass, field
from typing import Any

KEEP_S = 600.0  # a result read stays this long (a client's second read of it finds it)
UNREAD_S = 3600.0  # a result nobody read goes after this long
POLL_S = 25.0  # one retrieve_future waits this long at most (under the SDK's 45 s read timeout): then 408


@dataclass(frozen=True)
class Failed:
    """A request that failed: Tinker's `RequestFailedResponse`."""

    error: str
    category: str = "user"  # "user": the request's own fault (it would fail again); "server": the session's

    def body(self) -> dict[str, str]:
        return {"error": self.error, "category": self.category}


@dataclass
class _Entry:
    future: concurrent.futures.Future = field(default_factory=concurrent.futures.Future)
    done_at: float | None = None
    read_at: float | None = None


class Futures:
    """Request ids and their results (see the module docstring). Thread-safe: workers resolve, the API's
    event loop waits."""

    def __init__(self) -> None:
        self._entries: dict[str, _Entry] = {}
        self._lock = threading.Lock()
        self._prefix = f"req-{secrets.token_hex(3)}-"  # a request id of an earlier server is unknown, not another's
        self._count = itertools.count(1)

    def new(self) -> str:
        """A new pending request -> its id."""
        request_id = f"{self._prefix}{next(self._count)}"
        with self._lock:
            self._forget_old()
            self._entries[request_id] = _Entry()
        return request_id

    def resolve(self, request_id: str, result: dict | bytes | Failed) -> None:
        """The request's result (a JSON dict, protobuf bytes, or `Failed`)."""
        with self._lock:
            entry = self._entries.get(request_id)
        if entry is not None and not entry.future.done():
            entry.done_at = time.monotonic()
            entry.future.set_result(result)

    def known(self, request_id: str) -> bool:
        with self._lock:
            return request_id in self._entries

    async def wait(self, request_id: str, timeout: float = POLL_S) -> dict | bytes | Failed | None:
        """The request's result once it is there, or None after `timeout` s; `KeyError` for an unknown id."""
        with self._lock:
            entry = self._entries[request_id]
        try:
            result = await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(entry.future)), timeout)
        except TimeoutError:
            return None
        with self._lock:
            entry.read_at = entry.read_at or time.monotonic()
        return result

    def pending(self) -> int:
        with self._lock:
            return sum(not e.future.done() for e in self._entries.values())

    def _forget_old(self) -> None:
        now = time.monotonic()
        old = [
            rid
            for rid, e in self._entries.items()
            if (e.read_at is not None and now - e.read_at > KEEP_S)
            or (e.done_at is not None and now - e.done_at > UNREAD_S)
        ]
        for rid in old:
            del self._entries[rid]

    def fail_pending(self, why: str) -> None:
        """Every request not done yet fails with `why` (the server stops)."""
        with self._lock:
            entries = list(self._entries.values())
        for e in entries:
            if not e.future.done():
                e.done_at = time.monotonic()
                e.future.set_result(Failed(why, "server"))


def as_json(value: Any) -> Any:
    """A pydantic response of the SDK (or a dict) as the JSON body it is sent as."""
    return value.model_dump(mode="json", exclude_none=True) if hasattr(value, "model_dump") else value
