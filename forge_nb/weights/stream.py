"""Weights over plain TCP streams: the cross-host refresh path ("tcp" transport).

Monarch's RDMA buffers move bytes over its TCP fallback where there is no ibverbs, measured at
0.25-0.43 GB/s between two hosts joined by veth links that carry 1.7-2.7 GB/s on plain sockets. So
across hosts the trainer also serves its two published buffers from a `ChunkServer`: a thread
accepting connections on every interface, each connection a loop of requests ``(buffer, offset,
length)`` answered with exactly those bytes, sent straight from the buffer's memory.

A `StreamReader` keeps `streams` connections open and copies a buffer as chunks of `chunk_bytes`
that the streams take in turn, each received straight into the caller's staging tensor (no second
copy); the streams run in threads, which the socket calls leave free of the GIL. The 64-byte header
is read on its own before the first chunk is asked for and after the last one arrived, so the
version check of `weights.refresh` sees any publish that overlapped the copy (a torn read).

A stream that stalls for `timeout_s` (a link down, a host gone) fails the copy; the reader then
connects afresh and copies again, `attempts` times in all, and raises `StreamError` saying how far
it got. Nothing is loaded from a failed copy: the caller keeps the version it serves.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import psutil
import torch

from forge_nb.weights.manifest import HEADER_BYTES

REQUEST = struct.Struct("!BQQ")  # buffer index, offset, length (bytes)


class StreamError(OSError):
    """A copy over the TCP streams failed every attempt; the message says where and how far."""


@dataclass(frozen=True)
class StreamSpec:
    """Where a trainer serves its buffers (`hosts`: its addresses, tried in order; `port`) and how a
    reader copies them: `streams` connections, a stall of `timeout_s` fails a copy, `attempts` copies."""

    hosts: tuple[str, ...]
    port: int
    streams: int = 4
    timeout_s: float = 10.0
    attempts: int = 3


def host_addresses() -> tuple[str, ...]:
    """This host's IPv4 addresses that other hosts may dial (loopback last: same-host readers)."""
    found = [
        a.address
        for addrs in psutil.net_if_addrs().values()
        for a in addrs
        if a.family == socket.AF_INET and not a.address.startswith("127.")
    ]
    return (*found, "127.0.0.1")


class ChunkServer:
    """Serves byte ranges of `buffers` (flat uint8 tensors, alive as long as the server) on a TCP port
    of every interface; `spec` says where, for the manifest."""

    def __init__(self, buffers: Sequence[torch.Tensor]) -> None:
        self._views = [memoryview(b.numpy()).cast("B") for b in buffers]
        self._listener = socket.create_server(("0.0.0.0", 0), backlog=64)
        self.spec = StreamSpec(host_addresses(), self._listener.getsockname()[1])
        self._closed = False
        threading.Thread(target=self._accept, name="forge_nb-weights-server", daemon=True).start()

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return  # closed
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            threading.Thread(target=self._serve, args=(conn,), name="forge_nb-weights-stream", daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        with conn:
            try:
                while request := _recv_exact(conn, REQUEST.size):
                    index, offset, length = REQUEST.unpack(request)
                    conn.sendall(self._views[index][offset : offset + length])
            except OSError:
                return  # the reader went away (or its link did); it reconnects if it wants more

    def close(self) -> None:
        self._closed = True
        self._listener.close()


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    """`n` bytes, or b"" when the peer closed before the first byte."""
    data = bytearray()
    while len(data) < n:
        got = conn.recv(n - len(data))
        if not got:
            if data:
                raise ConnectionError("the stream closed mid-request")
            return b""
        data += got
    return bytes(data)


class StreamReader:
    """Copies published buffers from one `ChunkServer` over `streams` parallel connections."""

    def __init__(self, spec: StreamSpec, chunk_bytes: int) -> None:
        self.hosts, self.port, self.chunk_bytes = spec.hosts, spec.port, chunk_bytes
        self.streams, self.timeout_s, self.attempts = spec.streams, spec.timeout_s, spec.attempts
        self._conns: list[socket.socket] = []
        self._pool = ThreadPoolExecutor(max_workers=spec.streams, thread_name_prefix="forge_nb-weights-read")
        self.host: str | None = None  # the address that answered

    def _connect(self) -> None:
        self.close_connections()
        errors = []
        for host in [self.host] if self.host else self.hosts:
            try:
                self._conns = [socket.create_connection((host, self.port), self.timeout_s) for _ in range(self.streams)]
            except OSError as e:
                self.close_connections()
                errors.append(f"{host}: {e}")
                continue
            for c in self._conns:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                c.settimeout(self.timeout_s)  # a stall this long fails the copy (a link down)
            self.host = host
            return
        raise OSError(f"could not connect to the trainer's weights on port {self.port} ({'; '.join(errors)})")

    def close_connections(self) -> None:
        for c in self._conns:
            c.close()
        self._conns = []

    def read(self, index: int, staging: torch.Tensor) -> torch.Tensor:
        """Copy buffer `index` into `staging` (flat uint8, the buffer's size) -> its header as it was
        after the copy (the header bytes in `staging` are as they were before it)."""
        failures = []
        for attempt in range(1, self.attempts + 1):
            done = [0]
            try:
                if not self._conns:
                    self._connect()
                return self._read_once(index, staging, done)
            except OSError as e:  # socket.timeout is one: a stalled stream
                self.close_connections()
                failures.append(f"attempt {attempt}: {type(e).__name__}: {e} after {done[0]} of {staging.numel()} B")
        raise StreamError(
            f"weights from {self.host or self.hosts}:{self.port} failed {self.attempts} times "
            f"({'; '.join(failures)}); is the trainer's host reachable (link down, netem loss)?"
        )

    def _read_once(self, index: int, staging: torch.Tensor, done: list[int]) -> torch.Tensor:
        view = memoryview(staging.numpy()).cast("B")
        nbytes = len(view)
        self._fetch(self._conns[0], index, 0, view[:HEADER_BYTES])  # the version before any byte moves
        chunks = [(o, min(self.chunk_bytes, nbytes - o)) for o in range(HEADER_BYTES, nbytes, self.chunk_bytes)]
        lock, cursor = threading.Lock(), iter(chunks)

        def stream(conn: socket.socket) -> None:
            while True:
                with lock:
                    chunk = next(cursor, None)
                if chunk is None:
                    return
                self._fetch(conn, index, chunk[0], view[chunk[0] : chunk[0] + chunk[1]])
                with lock:
                    done[0] += chunk[1]

        for f in [self._pool.submit(stream, c) for c in self._conns]:
            f.result()
        after = torch.empty(HEADER_BYTES, dtype=torch.uint8)
        self._fetch(self._conns[0], index, 0, memoryview(after.numpy()).cast("B"))
        return after

    @staticmethod
    def _fetch(conn: socket.socket, index: int, offset: int, into: memoryview) -> None:
        conn.sendall(REQUEST.pack(index, offset, len(into)))
        got = 0
        while got < len(into):
            n = conn.recv_into(into[got:])
            if n == 0:
                raise ConnectionError("the trainer closed the stream")
            got += n

    def close(self) -> None:
        self.close_connections()
        self._pool.shutdown(wait=False)
