"""The `session` section: how a session's server lives (`forge_nb.server`)."""

from __future__ import annotations

from dataclasses import dataclass

from forge_nb.config.sections import ConfigError


@dataclass
class SessionConfig:
    """`idle_timeout_s`: a session's server ends itself (and every proc) after this many seconds with no client
    attached and no background run running; 0 keeps it until `down`. An hour, by default: a kernel restarted, a
    lunch break or a laptop closed for a meeting finds the session still there; a session forgotten overnight does
    not hold its GPUs until morning."""

    idle_timeout_s: float = 3600.0

    def validate(self) -> None:
        if self.idle_timeout_s < 0:
            raise ConfigError(f"session.idle_timeout_s must be >= 0 (0: no timeout), got {self.idle_timeout_s}")
