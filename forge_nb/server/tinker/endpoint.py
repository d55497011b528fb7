"""The Tinker API of a session, listening: `TinkerEndpoint` serves `routes` for a `TinkerService` from a thread of
the process that holds the session (the session's server, or a kernel or script with an in-process session).

    endpoint = session.serve_tinker()          # 127.0.0.1, a free port; host="0.0.0.0" only when asked
    endpoint.url, endpoint.api_key             # TINKER_BASE_URL, TINKER_API_KEY (a "tml-" key of this session's)

The key is made for the endpoint (random, never written to a log), and every request must carry it; what the
endpoint refuses (no key, bytes that are not HTTP, a silent connection) is counted as the "Tinker API <host>:<port>"
listener's (`runtime.refusals`: the session's "security" events). The endpoint stops with the session
(`Session.down`).
"""

from __future__ import annotations

import secrets

from forge_nb.runtime.http_thread import HttpThread
from forge_nb.server.tinker.routes import make_app
from forge_nb.server.tinker.service import TinkerService


class TinkerEndpoint:
    """`session`'s Tinker API on `host`:`port` (0: a free one)."""

    def __init__(self, session, host: str = "127.0.0.1", port: int = 0) -> None:
        self.host = host
        self.api_key = f"tml-{secrets.token_urlsafe(32)}"
        self.service = TinkerService(session)
        app = make_app(self.service, self.api_key, lambda: self._http.listener)
        self._http = HttpThread(app, host, port, "forge_nb-tinker", "Tinker API")

    def start(self) -> TinkerEndpoint:
        try:
            self._http.start()
        except BaseException:
            self.service.stop()
            raise
        return self

    def stop(self) -> None:
        """Stop listening, fail what is still queued, stop the queues' threads. Safe to call twice."""
        self._http.stop()
        self.service.stop()

    @property
    def port(self) -> int:
        return self._http.port

    @property
    def url(self) -> str:
        """The SDK's ``base_url`` (``TINKER_BASE_URL``)."""
        host = "127.0.0.1" if self.host in ("0.0.0.0", "") else self.host
        return f"http://{host}:{self.port}"

    @property
    def running(self) -> bool:
        return self._http.running

    def stats(self) -> dict:
        """For `status()`: the URL, the model trained, and how the queues batched what they served."""
        service = self.service
        model = service.model
        return {
            "url": self.url,
            "model": model.model_id if model is not None else None,
            "forward_backward_requests": service.training.merged,
            "trainer_calls": service.training.batches,
            "sample_requests": service.sampling.requests,
            "sampler_calls": service.sampling.calls,
            "pending": service.futures.pending(),
        }

    def env(self) -> dict[str, str]:
        """What a script's environment needs for ``tinker.ServiceClient()`` to reach this session."""
        return {"TINKER_BASE_URL": self.url, "TINKER_API_KEY": self.api_key}

    def __repr__(self) -> str:
        return f"<forge_nb Tinker API at {self.url} (api_key: .api_key)>"
