"""An OpenAI-compatible HTTP endpoint for the live policy, one URL per trajectory.

    endpoint = Endpoint().start()                  # uvicorn on 127.0.0.1, a free port, its own thread
    tid = endpoint.open(AgentClient(batcher, tokenizer, trajectory))
    client = endpoint.client(tid)                  # a real openai.AsyncOpenAI on .../t/<tid>/v1
    ...                                            # or any framework given endpoint.base_url(tid), endpoint.token
    endpoint.close(tid); endpoint.stop()           # the port is closed when stop() returns

Every request carries the endpoint's token (``Authorization: Bearer <token>``, what `api_key` sends);
the trajectory id in the path picks the server-side `AgentClient` that records the call's exact
token ids and logprobs (`agents.client`), so every check of a conversation holds here as in process.
The routes and the request/response shapes are in `agents.http_api`. A request without the token (401),
bytes that are not HTTP, and a connection that sends nothing for `FIRST_BYTES_S` (`runtime.http_thread`; uvicorn
itself would hold it for ever) are refused and counted (`runtime.refusals`): the session says so in its events.

A trajectory's calls run on the event loop that opened it (where its batcher gathers the calls of many
trajectories into one generator batch); one opened outside any loop runs on the server's own loop.
"""

from __future__ import annotations

import asyncio
import secrets
import threading
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from forge_nb.agents.client import AgentClient
from forge_nb.runtime.http_thread import HttpThread


class EndpointError(RuntimeError):
    """The endpoint could not start."""


class TrajectoryClosed(LookupError):
    """A request for a trajectory id that is unknown or closed."""


@dataclass
class Opened:
    """One open trajectory: its server-side client, the loop its calls run on, and its stored Responses
    (response id -> the conversation it ends, as chat messages: `previous_response_id` continues it)."""

    client: AgentClient
    loop: asyncio.AbstractEventLoop | None
    responses: dict[str, list[dict]] = field(default_factory=dict)


class Endpoint:
    """The HTTP server and its open trajectories. `host` 127.0.0.1 by default (the mesh's address to
    serve agents on other hosts); `token` a fresh random one unless given."""

    def __init__(self, host: str = "127.0.0.1", port: int = 0, token: str | None = None) -> None:
        self.host, self.port = host, port
        self.token = token or f"forge-{secrets.token_urlsafe(24)}"
        self.trajectories: dict[str, Opened] = {}
        self.requests = 0  # every request served (for tests and the benchmark)
        self._next = 0
        self._http: HttpThread | None = None
        self._lock = threading.Lock()

    # -- lifetime -----------------------------------------------------------------------------------
    def start(self) -> Endpoint:
        """Serve on `host` (a free port when `port` is 0) in a daemon thread -> self, once it listens."""
        from forge_nb.agents.http_api import make_app

        try:
            http = HttpThread(make_app(self), self.host, self.port, "forge-endpoint", "agents endpoint")
            self._http = http.start()
        except OSError as e:
            raise EndpointError(f"the endpoint did not start on {self.host}:{self.port}: {e}") from e
        self.port = self._http.port
        return self

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop serving and close the port; safe to call twice."""
        if self._http is not None:
            self._http.stop(timeout_s)

    @property
    def running(self) -> bool:
        return self._http is not None and self._http.running

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    @property
    def name(self) -> str:
        """How its refusals name it (`runtime.refusals`)."""
        return f"agents endpoint {self.host}:{self.port}"

    # -- trajectories ------------------------------------------------------------------------------
    def open(self, client: AgentClient) -> str:
        """Register `client`'s trajectory -> its id (its calls go to ``base_url(id)``)."""
        try:
            loop: asyncio.AbstractEventLoop | None = asyncio.get_running_loop()
        except RuntimeError:
            loop = None
        with self._lock:
            self._next += 1
            t = client.trajectory
            tid = f"{t.group}-{t.sample}-{self._next}-{secrets.token_hex(3)}"
            self.trajectories[tid] = Opened(client, loop)
        return tid

    def close(self, tid: str) -> None:
        """No more calls to trajectory `tid` (a later request gets 404)."""
        with self._lock:
            self.trajectories.pop(tid, None)

    def get(self, tid: str) -> Opened:
        with self._lock:
            opened = self.trajectories.get(tid)
        if opened is None:
            raise TrajectoryClosed(f"no open trajectory {tid!r}: it was closed (its rollout ended) or never opened")
        return opened

    def base_url(self, tid: str) -> str:
        """The OpenAI base URL of trajectory `tid` (what ``OpenAI(base_url=...)`` takes)."""
        return f"{self.url}/t/{tid}/v1"

    def client(self, tid: str, **kwargs: Any):
        """A real `openai.AsyncOpenAI` bound to trajectory `tid` (see `agents.openai_client`)."""
        from forge_nb.agents.openai_client import TrajectoryClient

        return TrajectoryClient(self.base_url(tid), self.token, self.get(tid).client.trajectory, **kwargs)

    async def run(self, opened: Opened, call: Coroutine) -> Any:
        """Await `call` on the loop of the trajectory's batcher (this one when it is the same)."""
        here = asyncio.get_running_loop()
        if opened.loop is None or opened.loop is here:
            return await call
        return await asyncio.wrap_future(asyncio.run_coroutine_threadsafe(call, opened.loop))
