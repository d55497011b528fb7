"""forge_nb: interactive RL post-training of language models on a kernel-held Monarch mesh.

import forge_nb
s = forge_nb.up()          # local CPU mesh, bundled model and task
s.step(5)                  # 5 x (rollout, train, sync) -> DataFrame
s.down()
"""

from __future__ import annotations

from typing import Any

from forge_nb.config import Config, ConfigError

__version__ = "0.1.0"


def up(config: Config | None = None, **overrides: Any):
    """Start a session (see `forge_nb.session.Session.up`)."""
    from forge_nb.session import Session  # deferred: importing Monarch and torch takes a second

    return Session.up(config, **overrides)


__all__ = ["Config", "ConfigError", "up", "__version__"]
