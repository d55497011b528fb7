"""Weights over plain TCP streams: the cross-host refresh path ("tcp" transport).

Monarch's RDMA buffers move bytes over its TCP fallback where there is no ibverbs, measured at
0.25-0.43 GB/s between two hosts joined by veth links that carry 1.7-2.7 GB/s on plain sockets. So
across hosts the trainer also serves its two published buffers from a `ChunkServer`: a thread
accepting connections at the trainer host's address on the mesh's network (the one its readers dial;
127.0.0.1 on a local mesh), each connection a loop of requests ``(buffer, offset, length)`` answered with
exactly those bytes, sent straight from the buffer's memory.

Only the session's readers are served: a connection first proves the session's secret (`StreamSpec.secret`,
32 random bytes the session makes and hands to the trainer in its spec and to the generators in the
manifest, never written anywhere), in a challenge and response before any byte of a buffer moves: the
server sends a fresh nonce, the reader answers HMAC-SHA256(secret, nonce) with a nonce of its own, the
server checks it in constant time and proves the secret back the same way. A connection that does not
prove it within `HANDSHAKE_S`, sends garbage, or asks for bytes outside a buffer is closed; past
`MAX_HANDSHAKES` connections in their handshake at once, the oldest of them is. Each is counted
(`runtime.refusals`); the session says so in its events. The bytes themselves travel in the clear.

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

import errno
import hashlib
import hmac
import os
import selectors
import socket
import struct
import threading
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

import psutil
import torch

from forge_nb.runtime.refusals import REFUSED
from forge_nb.weights.manifest import HEADER_BYTES

REQUEST = struct.Struct("!BQQ")  # buffer index, offset, length (bytes)
NONCE = 32  # bytes of each side's challenge
HANDSHAKE_S = 5.0  # a connection that has not proven the secret by then is closed
MAX_HANDSHAKES = 256  # connections in their handshake at once; past it the oldest is closed (a flood)
OUT_OF_RESOURCES = (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM)  # accept fails; the server goes on


class StreamError(OSError):
    """A copy over the TCP streams failed every attempt; the message says where and how far."""


@dataclass(frozen=True)
class StreamSpec:
    """Where a trainer serves its buffers (`hosts`: its addresses, tried in order; `port`) and how a
    reader copies them: `streams` connections, a stall of `timeout_s` fails a copy, `attempts` copies;
    `secret`: what every connection proves (the session's, set by the session before readers get it)."""

    hosts: tuple[str, ...]
    port: int
    streams: int = 4
    timeout_s: float = 10.0
    attempts: int = 3
    secret: bytes = field(default=b"", repr=False)


def _proof(secret: bytes, role: bytes, *nonces: bytes) -> bytes:
    return hmac.new(secret, b"forge_nb weights " + role + b"".join(nonces), hashlib.sha256).digest()


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
    """Serves byte ranges of `buffers` (flat uint8 tensors, alive as long as the server) on a TCP port at
    `host` to readers that prove `secret`; `spec` says where, for the manifest (the session adds the secret).

    One thread accepts connections and runs every handshake at once, without blocking on any (`_Handshake`);
    a connection that proves the secret gets a thread of its own that serves its requests."""

    def __init__(self, buffers: Sequence[torch.Tensor], secret: bytes, host: str = "127.0.0.1") -> None:
        if len(secret) < 16:
            raise ValueError("a weights stream needs the session's secret (16 bytes or more)")
        self._views = [memoryview(b.numpy()).cast("B") for b in buffers]
        self._secret = secret
        self._listener = socket.create_server((host, 0), backlog=128)
        self._listener.setblocking(False)
        self.spec = StreamSpec((host,), self._listener.getsockname()[1])
        self.name = f"weights stream {host}:{self.spec.port}"
        self._closed = False
        threading.Thread(target=self._accept, name="forge_nb-weights-server", daemon=True).start()

    def _accept(self) -> None:
        """Accept, and move every handshake on as its bytes come: proven -> `_serve` in a thread; wrong, silent
        past `HANDSHAKE_S`, or the oldest of more than `MAX_HANDSHAKES` -> closed and counted."""
        selector = selectors.DefaultSelector()
        pending: dict[socket.socket, _Handshake] = {}  # oldest first
        try:
            selector.register(self._listener, selectors.EVENT_READ)
            while not self._closed:
                deadline = min((h.deadline for h in pending.values()), default=time.monotonic() + 0.5)
                for key, _ in selector.select(max(0.0, min(deadline - time.monotonic(), 0.5))):
                    if key.fileobj is self._listener:
                        self._take_new(selector, pending)
                    else:
                        self._step(selector, pending, key.fileobj)
                now = time.monotonic()
                for conn in [c for c, h in pending.items() if h.deadline <= now]:
                    self._drop(selector, pending, conn, "handshake not finished")
        except (OSError, ValueError):
            if not self._closed:
                raise
        finally:
            for conn in list(pending):
                conn.close()
            selector.close()

    def _take_new(self, selector: selectors.BaseSelector, pending: dict) -> None:
        while True:
            try:
                conn, peer = self._listener.accept()
            except BlockingIOError:
                return
            except OSError as e:
                if e.errno not in OUT_OF_RESOURCES:
                    raise
                REFUSED.refused(self.name, "no file descriptors left")
                time.sleep(0.05)
                return
            conn.setblocking(False)
            challenge = os.urandom(NONCE)
            try:
                conn.send(challenge)  # 32 bytes into an empty send buffer: never partial
            except OSError:
                conn.close()
                continue
            pending[conn] = _Handshake(challenge, peer, time.monotonic() + HANDSHAKE_S)
            selector.register(conn, selectors.EVENT_READ)
            if len(pending) > MAX_HANDSHAKES:  # a flood: the oldest goes (a reader's handshake takes one round trip)
                self._drop(selector, pending, next(iter(pending)), "too many connections at once")

    def _step(self, selector: selectors.BaseSelector, pending: dict, conn: socket.socket) -> None:
        handshake = pending.get(conn)
        if handshake is None:  # dropped earlier in this round (the oldest of a flood)
            return
        try:
            got = conn.recv(32 + NONCE - len(handshake.answer))
        except BlockingIOError:
            return
        except OSError:
            got = b""
        if not got:
            self._drop(selector, pending, conn, "closed in its handshake")
            return
        handshake.answer += got
        if len(handshake.answer) < 32 + NONCE:
            return
        answer = handshake.answer
        if not hmac.compare_digest(answer[:32], _proof(self._secret, b"reader", handshake.challenge)):
            self._drop(selector, pending, conn, "no secret")
            return
        selector.unregister(conn)
        del pending[conn]
        conn.setblocking(True)  # a reader keeps its streams open between refreshes: no timeout
        try:
            conn.sendall(_proof(self._secret, b"server", answer[32:], handshake.challenge))
        except OSError:
            conn.close()
            return
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(
            target=self._serve, args=(conn, handshake.peer), name="forge_nb-weights-stream", daemon=True
        ).start()

    def _drop(self, selector: selectors.BaseSelector, pending: dict, conn: socket.socket, why: str) -> None:
        handshake = pending.pop(conn)
        selector.unregister(conn)
        conn.close()
        REFUSED.refused(self.name, why, _peer(handshake.peer))

    def _serve(self, conn: socket.socket, peer: tuple) -> None:
        """A proven reader's requests, each answered with exactly those bytes, until it closes."""
        with conn:
            try:
                while request := _recv_exact(conn, REQUEST.size):
                    index, offset, length = REQUEST.unpack(request)
                    if index >= len(self._views) or length == 0 or offset + length > len(self._views[index]):
                        REFUSED.refused(self.name, "request outside the buffers", _peer(peer))
                        return
                    conn.sendall(self._views[index][offset : offset + length])
            except OSError:
                return  # the reader went away (or its link did); it reconnects if it wants more

    def close(self) -> None:
        self._closed = True
        self._listener.close()


@dataclass
class _Handshake:
    """One connection's handshake so far: the nonce sent, what the reader answered, until when it may take."""

    challenge: bytes
    peer: tuple
    deadline: float
    answer: bytes = b""


def _peer(address: tuple) -> str:
    return f"{address[0]}:{address[1]}" if address else ""


def _recv_all(conn: socket.socket, n: int) -> bytes:
    """`n` bytes; `ConnectionError` when the peer closes before."""
    data = _recv_exact(conn, n)
    if len(data) < n:
        raise ConnectionError("the weights server closed the connection (it did not take this reader's secret)")
    return data


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
        if not spec.secret:
            raise ValueError("the trainer's weights streams need the session's secret, and this reader was given none")
        self.secret = spec.secret
        self._conns: list[socket.socket] = []
        self._pool = ThreadPoolExecutor(max_workers=spec.streams, thread_name_prefix="forge_nb-weights-read")
        self.host: str | None = None  # the address that answered

    def _connect(self) -> None:
        self.close_connections()
        errors = []
        for host in [self.host] if self.host else self.hosts:
            try:
                for _ in range(self.streams):
                    self._conns.append(socket.create_connection((host, self.port), self.timeout_s))
                    self._conns[-1].settimeout(self.timeout_s)  # a stall this long fails the copy (a link down)
                    self._prove(self._conns[-1])
            except OSError as e:
                self.close_connections()
                errors.append(f"{host}: {e}")
                continue
            for c in self._conns:
                c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            self.host = host
            return
        raise OSError(f"could not connect to the trainer's weights on port {self.port} ({'; '.join(errors)})")

    def _prove(self, conn: socket.socket) -> None:
        """The handshake of `ChunkServer._handshake`, from the reader's side: prove the secret, check the server's."""
        challenge = _recv_all(conn, NONCE)
        mine = os.urandom(NONCE)
        conn.sendall(_proof(self.secret, b"reader", challenge) + mine)
        if not hmac.compare_digest(_recv_all(conn, 32), _proof(self.secret, b"server", mine, challenge)):
            raise ConnectionError("the weights server did not prove the session's secret")

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
