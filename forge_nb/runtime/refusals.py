"""Connections forge_nb's listeners refused or dropped (no secret, garbage, a handshake that never finished, one
connection too many), counted per listener and reason, and said at most once a second.

Each process counts its own listeners' refusals in `REFUSED` (the weights streams of a trainer proc, the agents'
endpoint of an env proc or of the session's server, the session's socket): keys ``"LISTENER: WHY"`` -> how many
since the process started. A host's worker counts what it sees of its own port (`StalledHandshakes`) and writes its
totals to a file of its own that the procs it starts read (`worker_totals`). The session gathers the totals of its
procs at step boundaries (`Fleet.refusals`), and says what is new in one ``"security"`` event, at most once a second
(`Refusals` with a `report`).
"""

from __future__ import annotations

import json
import os
import resource
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

EVERY_S = 1.0  # at most one report a second
POLL_S = 5.0  # a session asks its procs at a step boundary this long after it last did (a few calls)
WORKER_REPORT = "FORGE_NB_WORKER_REFUSALS"  # the worker's totals file, in the environment of the procs it starts


class Refusals:
    """Refusals counted by ``"LISTENER: WHY"``; with `report`, what was refused is said through it at most once
    every `every_s` (what comes within a second of a report is said together once the second is over)."""

    def __init__(self, report: Callable[[str], None] | None = None, every_s: float = EVERY_S) -> None:
        self.report, self.every_s = report, every_s
        self._totals: Counter[str] = Counter()
        self._pending: Counter[str] = Counter()
        self._last_peer = ""
        self._said = 0.0
        self._timer: threading.Timer | None = None
        self._lock = threading.Lock()

    def refused(self, listener: str, why: str, peer: str = "", n: int = 1) -> None:
        """`n` connections to `listener` refused or dropped for `why` (from `peer`, when known)."""
        if n <= 0:
            return
        key = f"{listener}: {why}"
        with self._lock:
            self._totals[key] += n
            self._pending[key] += n
            self._last_peer = peer or self._last_peer
            if self.report is None:
                self._pending.clear()
                return
            wait = self._said + self.every_s - time.monotonic()
            if wait > 0:
                if self._timer is None:
                    self._timer = threading.Timer(wait, self._say)
                    self._timer.daemon = True
                    self._timer.start()
                return
        self._say()

    def add(self, totals: dict[str, int], seen: dict[str, int]) -> None:
        """Totals a process reported (`totals`, each ``"LISTENER: WHY"``): what grew since `seen` (the same report's
        last totals, updated here) counts as refused now."""
        for key, count in totals.items():
            grew = count - seen.get(key, 0)
            seen[key] = max(count, seen.get(key, 0))
            if grew > 0:
                listener, _, why = key.partition(": ")
                self.refused(listener, why, n=grew)

    def totals(self) -> dict[str, int]:
        with self._lock:
            return dict(self._totals)

    def _say(self) -> None:
        with self._lock:
            self._timer = None
            pending, self._pending = self._pending, Counter()
            peer, self._said = self._last_peer, time.monotonic()
        if pending and self.report is not None:
            self.report(describe(pending, peer))


def describe(counts: Counter[str], peer: str = "") -> str:
    """``refused 12 connections: weights stream 10.0.0.1:4567: no secret x10; ...`` (the last peer seen)."""
    total = sum(counts.values())
    parts = "; ".join(f"{key} x{n}" for key, n in counts.most_common())
    return f"refused {total} connection{'s' if total != 1 else ''}: {parts}" + (f" (last from {peer})" if peer else "")


REFUSED = Refusals()  # this process's listeners


def worker_totals() -> dict[str, int]:
    """The totals of the worker that started this proc (its report file, when there is one)."""
    path = os.environ.get(WORKER_REPORT)
    if not path:
        return {}
    try:
        return {str(k): int(v) for k, v in json.loads(Path(path).read_text()).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def process_totals() -> dict[str, int]:
    """What a proc tells the session: its own listeners' totals and its host worker's."""
    return {**REFUSED.totals(), **worker_totals()}


# struct tcp_info (linux/tcp.h): tcpi_last_data_recv (ms) at byte 52, tcpi_bytes_received at byte 128.
_TCP_INFO = 11  # socket.TCP_INFO
_LAST_DATA_RECV, _BYTES_RECEIVED = struct.Struct("=I"), struct.Struct("=Q")


class StalledHandshakes:
    """Watches a TCP port this process listens on but does not accept on itself (Monarch's, in a worker or in a
    session's controller) for connections that opened and then sent too little for a TLS handshake for `after_s`:
    a half-open connection or one of a flood. Monarch's TLS refuses a wrong certificate or garbage at once and says
    nothing of it; those are not seen here. Every `every_s` it counts the new ones as refused (`refusals`)."""

    HANDSHAKE_BYTES = 512  # a client's TLS handshake with its certificate sends well over this

    def __init__(self, port: int, listener: str, refusals: Refusals, after_s: float = 5.0, every_s: float = 1.0):
        self.port, self.listener, self.refusals = port, listener, refusals
        self.after_s, self.every_s = after_s, every_s
        self._counted: set[tuple] = set()
        self._stop = threading.Event()

    def start(self) -> StalledHandshakes:
        if sys.platform.startswith("linux"):
            threading.Thread(target=self._run, name="forge_nb-stalled-handshakes", daemon=True).start()
        return self

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        import psutil

        me = psutil.Process()
        while not self._stop.wait(self.every_s):
            try:
                stalled = self.stalled(me.net_connections("tcp"))
            except (psutil.Error, OSError):
                continue
            new = [peer for peer in stalled if peer not in self._counted]
            self._counted = set(stalled)
            if new:
                self.refusals.refused(self.listener, "handshake not finished", f"{new[-1][0]}:{new[-1][1]}", len(new))

    def stalled(self, connections: list) -> list[tuple]:
        """The peers of inbound connections to the port that have sent under `HANDSHAKE_BYTES` and nothing for
        `after_s`."""
        found = []
        for c in connections:
            if c.status != "ESTABLISHED" or not c.raddr or c.laddr.port != self.port or c.fd < 0:
                continue
            info = _tcp_info(c.fd)
            if info is None:
                continue
            last_recv_s = _LAST_DATA_RECV.unpack_from(info, 52)[0] / 1000
            received = _BYTES_RECEIVED.unpack_from(info, 128)[0] if len(info) >= 136 else 0
            if received < self.HANDSHAKE_BYTES and last_recv_s >= self.after_s:
                found.append(tuple(c.raddr))
        return found


def _tcp_info(fd: int) -> bytes | None:
    """TCP_INFO of the socket at `fd` (this process's, through a duplicate of it), or None."""
    try:
        sock = socket.socket(fileno=os.dup(fd))
    except OSError:
        return None
    try:
        return sock.getsockopt(socket.IPPROTO_TCP, _TCP_INFO, 256)
    except OSError:
        return None
    finally:
        sock.close()  # the duplicate only: the connection stays open


def raise_open_files_limit() -> int:
    """Raise this process's soft limit of open files to its hard limit -> the limit now. A flood of idle
    connections then takes far longer to lock a listener out (at the common soft limit of 1024, 1100 idle
    connections kept a Monarch worker from accepting its own session's)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = hard if hard != resource.RLIM_INFINITY else 1 << 20  # (the kernel's fs.nr_open caps an unlimited one)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            return target
        except (ValueError, OSError):
            pass
    return soft
