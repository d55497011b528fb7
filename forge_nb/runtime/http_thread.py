"""An HTTP server of the session's (an ASGI app under uvicorn) in a daemon thread of this process: the agents'
OpenAI-compatible endpoint and the Tinker API each run in one.

What each server refuses is counted (`runtime.refusals`) under its listener's name, and the session says so in its
events: bytes that are not HTTP (uvicorn answers 400), and a connection that sends nothing for `FIRST_BYTES_S`
(closed; uvicorn itself would hold it for ever). A request without the server's key is the app's to count."""

from __future__ import annotations

import asyncio
import logging
import socket
import threading
import time
from typing import Any

import uvicorn

from forge_nb.runtime.refusals import REFUSED

START_TIMEOUT_S = 10.0
FIRST_BYTES_S = 10.0  # a connection that has sent nothing by then is closed


def guarded_protocol(listener: str) -> type[asyncio.Protocol]:
    """uvicorn's HTTP protocol for `listener`, counting what it refuses: bytes that are not HTTP (uvicorn answers
    400), and a connection silent for `FIRST_BYTES_S` from its start (closed here: uvicorn's own keep-alive
    timeout only starts after a first response)."""
    from uvicorn.protocols.http.auto import AutoHTTPProtocol

    class Guarded(AutoHTTPProtocol):  # type: ignore[valid-type,misc]
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            super().connection_made(transport)
            self._first_bytes: asyncio.TimerHandle | None = self.loop.call_later(FIRST_BYTES_S, self._silent)

        def data_received(self, data: bytes) -> None:
            if self._first_bytes is not None:
                self._first_bytes.cancel()
                self._first_bytes = None
            super().data_received(data)

        def connection_lost(self, exc: Exception | None) -> None:
            if self._first_bytes is not None:
                self._first_bytes.cancel()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            REFUSED.refused(listener, "not HTTP", _peer(self.client))
            super().send_400_response(msg)

        def _silent(self) -> None:
            self._first_bytes = None
            REFUSED.refused(listener, "no request", _peer(self.client))
            self.transport.close()

    return Guarded


def _peer(client: tuple | None) -> str:
    return f"{client[0]}:{client[1]}" if client else ""


class _NotHttpCounted(logging.Filter):
    """uvicorn's warning for each request that is not HTTP: counted instead (a flood of garbage would fill the
    session's log)."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not record.getMessage().startswith("Invalid HTTP request received")


logging.getLogger("uvicorn.error").addFilter(_NotHttpCounted())


class HttpThread:
    """`app` served on `host`:`port` (a free port when 0) from a thread named `name`, once `start` returns; its
    refusals counted as `listener` ("<listener> <host>:<port>", the port once bound: `self.listener`)."""

    def __init__(self, app: Any, host: str, port: int, name: str, listener: str) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self._listener = listener
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def listener(self) -> str:
        """How its refusals name it (`runtime.refusals`)."""
        return f"{self._listener} {self.host}:{self.port}"

    def start(self) -> HttpThread:
        """Listen, then serve in a daemon thread -> self; `OSError` if it cannot bind or does not start."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(
            self.app, log_level="warning", access_log=False, lifespan="off", http=guarded_protocol(self.listener)
        )
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._serve, args=(sock,), name=self.name, daemon=True)
        self._thread.start()
        deadline = time.monotonic() + START_TIMEOUT_S
        while not self._server.started:
            if not self._thread.is_alive() or time.monotonic() > deadline:
                sock.close()
                raise OSError(f"{self.name} did not start on {self.host}:{self.port}")
            time.sleep(0.01)
        return self

    def _serve(self, sock: socket.socket) -> None:
        asyncio.run(self._server.serve(sockets=[sock]))  # type: ignore[union-attr]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the port; safe to call twice."""
        server, thread, self._server, self._thread = self._server, self._thread, None, None
        if server is None or thread is None:
            return
        server.should_exit = True
        thread.join(timeout_s)

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()
