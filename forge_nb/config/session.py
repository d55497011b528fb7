"""The `session` section: how a session's server lives (`forge_nb.server`)."""

from __future__ import annotations

from dataclasses import dataclass

from forge_nb.config.sections import ConfigError


@dataclass
class SessionConfig:
    """`idle_timeout_s`: a session's server ends itself (and every proc) after this many seconds with no client
    attached and no background run running; 0 keeps it until `down`. An hour, by default: a kernel restarted, a
    lunch break or a laptop closed for a meeting finds the session still there; a session forgotten overnight does
    not hold its GPUs until morning.

    `tinker_port`: serve the Tinker API (`Session.serve_tinker`) as soon as the session is up, on this port (0: a
    free one); None: only when asked. `tinker_host`: the address it listens on (127.0.0.1: this machine only)."""

    idle_timeout_s: float = 3600.0
    tinker_port: int | None = None
    tinker_host: str = "127.0.0.1"

    def validate(self) -> None:
        if self.idle_timeout_s < 0:
            raise ConfigError(f"session.idle_timeout_s must be >= 0 (0: no timeout), got {self.idle_timeout_s}")
        if self.tinker_port is not None and not 0 <= self.tinker_port < 65536:
            raise ConfigError(f"session.tinker_port must be a port (0: a free one) or None, got {self.tinker_port}")
        if not self.tinker_host:
            raise ConfigError("session.tinker_host must be an address, e.g. 127.0.0.1")
