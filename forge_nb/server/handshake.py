"""Who is at the other end of a session's or a zygote's Unix socket: this user (the socket's peer credentials),
holding the key (`multiprocessing.connection`'s HMAC challenge, each way), within a deadline. Imports only the
standard library: the zygote (`server.zygote`) uses it before it forks a server, with nothing else loaded."""

from __future__ import annotations

import os
import socket
import struct
import time
from multiprocessing.connection import Connection, answer_challenge, deliver_challenge
from typing import Any


class Deadline:
    """A connection whose reads raise TimeoutError once `deadline` (time.monotonic) has passed with nothing to
    read: what `multiprocessing.connection`'s challenge functions call (send_bytes, recv_bytes, recv)."""

    def __init__(self, conn: Connection, deadline: float) -> None:
        self.conn, self.deadline = conn, deadline

    def _wait(self) -> None:
        if not self.conn.poll(max(0.0, self.deadline - time.monotonic())):
            raise TimeoutError("handshake not finished in time")

    def send_bytes(self, data: bytes) -> None:
        self.conn.send_bytes(data)

    def recv_bytes(self, maxlength: int | None = None) -> bytes:
        self._wait()
        return self.conn.recv_bytes(maxlength)

    def recv(self) -> Any:
        self._wait()
        return self.conn.recv()


def peer_uid(conn: Connection) -> int:
    """The user id of the process at the other end of a Unix socket (SO_PEERCRED)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    try:
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    finally:
        sock.close()
    return struct.unpack("3i", creds)[1]


def prove_to_server(conn: Connection, key: bytes) -> None:
    """The client's half: answer the server's challenge, then challenge it (`AuthenticationError` if it does not
    hold `key`)."""
    answer_challenge(conn, key)
    deliver_challenge(conn, key)


def check_client(conn: Connection, key: bytes, deadline: float) -> Deadline:
    """The server's half, every read bounded by `deadline` -> the connection with that bound (its next `recv`
    too). Raises AuthenticationError (no key) or TimeoutError."""
    bounded = Deadline(conn, deadline)
    deliver_challenge(bounded, key)
    answer_challenge(bounded, key)
    return bounded
