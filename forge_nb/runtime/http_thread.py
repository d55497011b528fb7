"""An HTTP server of the session's (an ASGI app under uvicorn) in a daemon thread of this process: the agents'
OpenAI-compatible endpoint and the Tinker API each run in one."""

from __future__ import annotations

import asyncio
import socket
import threading
import time
from typing import Any

import uvicorn

START_TIMEOUT_S = 10.0


class HttpThread:
    """`app` served on `host`:`port` (a free port when 0) from a thread named `name`, once `start` returns."""

    def __init__(self, app: Any, host: str, port: int, name: str) -> None:
        self.app, self.host, self.port, self.name = app, host, port, name
        self._server: uvicorn.Server | None = None
        self._thread: threading.Thread | None = None

    def start(self) -> HttpThread:
        """Listen, then serve in a daemon thread -> self; `OSError` if it cannot bind or does not start."""
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
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
