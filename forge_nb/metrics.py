"""The one metrics stream: every phase emits rows here; tables, dashboard, CLI and benchmarks read it."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import pandas as pd

Subscriber = Callable[[dict[str, Any]], None]


class MetricsStream:
    """Append-only rows ``{"time": unix s, "kind": phase, ...values}``; thread-safe.

    Kinds emitted by the session: ``rollout``, ``train``, ``sync``, ``step``, ``eval``.
    Units: seconds for ``*_s``, tokens per second for ``tokens_per_s``, GB/s (1e9 bytes) for ``*gbps``.
    """

    def __init__(self, rows: list[dict[str, Any]] | None = None) -> None:
        self._rows: list[dict[str, Any]] = list(rows or [])  # a checkpoint's, when resuming
        self._subscribers: list[Subscriber] = []
        self._lock = threading.Lock()

    def emit(self, kind: str, **values: Any) -> dict[str, Any]:
        row = {"time": time.time(), "kind": kind, **values}
        with self._lock:
            self._rows.append(row)
            subscribers = list(self._subscribers)
        for notify in subscribers:
            notify(row)
        return row

    def subscribe(self, notify: Subscriber) -> Callable[[], None]:
        """Call `notify(row)` on every new row; returns a function that unsubscribes."""
        with self._lock:
            self._subscribers.append(notify)
        return lambda: self._subscribers.remove(notify)

    def rows(self, kind: str | None = None) -> list[dict[str, Any]]:
        with self._lock:
            return [r for r in self._rows if kind is None or r["kind"] == kind]

    def since(self, first: int) -> list[dict[str, Any]]:
        """The rows from index `first` on (every kind, in order)."""
        with self._lock:
            return self._rows[first:]

    def __len__(self) -> int:
        return len(self._rows)

    def to_pandas(self, kind: str | None = None) -> pd.DataFrame:
        return pd.DataFrame(self.rows(kind))
