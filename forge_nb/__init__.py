"""forge_nb: interactive RL post-training of language models on a persistent Monarch mesh.

import forge_nb
s = forge_nb.up()          # a session server with a local CPU mesh, the bundled model and task
s.step(5)                  # 5 x (rollout, train, sync) -> DataFrame
s.down()                   # the session, every proc and its server

A session lives in a server process of its own, so it outlives the kernel or script that started it:
`forge_nb.attach(name)` takes it up from another kernel or script, `forge-nb ps` lists this user's sessions.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

# Monarch logs every message, launch and actor of every proc at INFO into one file per user that nothing
# rotates (/tmp/<user>/monarch_log.log: tens of MB a day of runs, and launch records that list the environment
# handed to procs). Warnings and errors are what a failure needs; set before Monarch loads, and inherited by every
# proc. MONARCH_FILE_LOG=info (or debug) in the environment wins.
os.environ.setdefault("MONARCH_FILE_LOG", "warn")

from forge_nb.config import Config, ConfigError  # noqa: E402 -- after the variable above

__version__ = "0.1.0"


def up(
    config: Config | None = None,
    *,
    name: str | None = None,
    new: bool = False,
    persist: bool | None = None,
    **overrides: Any,
):
    """Start a session in a server of its own and attach to it -> a `NotebookSession` (the `Session` API).

    `config`, or fields as keyword arguments (``lr=1e-4``, ``task=rows``; see `Config`). In a notebook the
    session is named after the notebook, and when that session is still running (the kernel was restarted),
    `up` attaches to it and says so (same config; `new=True` starts another beside it). `name` names the
    session (`forge_nb.attach(name)`). `persist`: whether the session outlives this process -- by default yes
    in a Jupyter kernel, no in a script (its session goes down when the script exits). A session with no client
    and nothing running ends itself after ``session.idle_timeout_s``."""
    from forge_nb.notebook.session import NotebookSession  # deferred: the client imports little
    from forge_nb.server import start
    from forge_nb.tasks.data import take_task_data

    overrides, data = take_task_data(overrides)
    return start.up(config, overrides, data, name, new, persist, NotebookSession)


def attach(name: str | None = None):
    """The running session `name` (None: this notebook's, or the one session of this user that runs) -> a
    `NotebookSession`: the same session, its versions, rollout log, metrics history and background run."""
    from forge_nb.notebook.session import NotebookSession
    from forge_nb.server import start

    return start.attach(name, NotebookSession)


def resume(path, *, name: str | None = None, persist: bool | None = None, **overrides: Any):
    """A new session that goes on exactly where the checkpoint at `path` was (see `Session.restore`), in a server
    of its own; `overrides` change config fields (``lr=1e-5``)."""
    from forge_nb.notebook.session import NotebookSession
    from forge_nb.server import start

    return start.resume(path, overrides, name, persist, NotebookSession)


def ps():
    """This user's sessions, one row each (name, state, model, mesh, step, versions, run, clients, age)."""
    from forge_nb.server import start

    return start.ps()


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


def __getattr__(name: str):
    if name == "Session":  # the controller itself, in this process (what a session's server holds)
        from forge_nb.session import Session

        return Session
    raise AttributeError(f"module 'forge_nb' has no attribute {name!r}")


__all__ = [
    "Config",
    "ConfigError",
    "Session",
    "attach",
    "load_ipython_extension",
    "loss",
    "ps",
    "resume",
    "reward",
    "up",
    "__version__",
]
