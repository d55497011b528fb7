"""forge_nb: interactive RL post-training of language models on a kernel-held Monarch mesh.

import forge_nb
s = forge_nb.up()          # local CPU mesh, bundled model and task
s.step(5)                  # 5 x (rollout, train, sync) -> DataFrame
s.down()
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# Monarch logs every message, launch and actor of every proc at INFO into one file per user that nothing
# rotates (/tmp/<user>/monarch_log.log: tens of MB a day of runs, and launch records that list the environment
# handed to procs). Warnings and errors are what a failure needs; set before Monarch
# loads, and inherited by every proc. MONARCH_FILE_LOG=info (or debug) in the environment wins.
os.environ.setdefault("MONARCH_FILE_LOG", "warn")

from forge_nb.config import Config, ConfigError  # noqa: E402 -- after the variable above

__version__ = "0.1.0"


def up(config: Config | None = None, **overrides: Any):
    """Start a session (see `forge_nb.session.Session.up`; with a notebook's views: `notebook.session`)."""
    from forge_nb.notebook.session import NotebookSession  # deferred: importing Monarch and torch takes a second

    return NotebookSession.up(config, **overrides)


def resume(path, **overrides: Any):
    """A session that goes on exactly where the checkpoint at `path` was (see `Session.restore`)."""
    from forge_nb.notebook.session import NotebookSession

    return NotebookSession.restore(path, **overrides)


def _current_session():
    from forge_nb.runtime import lifecycle

    session = lifecycle.current()
    if session is None:
        raise RuntimeError("forge_nb: no session is up; run forge_nb.up() (or %forge up) first")
    return session


def reward(fn: Callable) -> Callable:
    """Decorator: validate `fn` and make it the live reward of the current session. Returns `fn`."""
    _current_session().set_reward(fn)
    return fn


def loss(fn: Callable) -> Callable:
    """Decorator: validate `fn` and make it the live loss of the current session. Returns `fn`."""
    _current_session().set_loss(fn)
    return fn


def load_ipython_extension(ipython) -> None:
    """`%load_ext forge_nb`: registers `%forge` and `%%forge reward` / `%%forge loss`."""
    from forge_nb.notebook.magics import load_ipython_extension as load

    load(ipython)


__all__ = ["Config", "ConfigError", "load_ipython_extension", "loss", "resume", "reward", "up", "__version__"]
