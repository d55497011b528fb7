"""What crosses between a session's server and its clients, over `multiprocessing.connection` (a Unix socket, the
session's key proven by HMAC challenge in both directions when a client connects; messages are pickled objects).

A client sends `Hello` once, then calls: ``("call", method, args, kwargs, wait)``; the server answers with
``("ok", value)``, ``("busy", holder)`` (an exclusive command runs for another client and `wait` was false), or
``("error", Failure)``. What crosses is what a person looks at -- tables, rows, statuses, views of a rollout or a
run -- and live code as captured source; a batch's episodes and tensors stay in the server (`RolloutView` is a
handle with the batch's summary).
"""

from __future__ import annotations

import os
import pickle
import socket
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any

REQUEST = "request.pkl"  # what to start, written by the client into the session's folder (0600)


@dataclass(frozen=True)
class StartRequest:
    """What a client asks a new server to run: a session from `config` (and in-memory task `data`), or one
    resumed from the checkpoint at `resume_from` with `overrides`."""

    config: Any  # forge_nb.config.Config
    data: Any = None
    resume_from: str | None = None
    overrides: dict | None = None
    owner: tuple[int, float] | None = None  # (pid, start time): a script's session ends when its script does


@dataclass(frozen=True)
class Hello:
    """Who a client is: shown by `forge-nb ps`, the sidebar, and in a busy session's message."""

    client_id: str
    who: str  # e.g. "kernel 4242 (notebooks/01_quickstart.ipynb)", "script 4300 (train.py)"
    pid: int
    host: str

    @classmethod
    def here(cls, client_id: str) -> Hello:
        return cls(client_id, describe_process(), os.getpid(), socket.gethostname())


def describe_process() -> str:
    """This process as a person would name it: the notebook a kernel runs, or the script."""
    notebook = os.environ.get("JPY_SESSION_NAME")  # jupyter_server sets it to the notebook's path
    if notebook:
        return f"kernel {os.getpid()} ({os.path.basename(notebook)})"
    if "ipykernel" in sys.modules:
        return f"kernel {os.getpid()}"
    script = os.path.basename(sys.argv[0]) if sys.argv and sys.argv[0] else "python"
    return f"{script} {os.getpid()}"


@dataclass(frozen=True)
class Failure:
    """An exception raised in the server: the exception itself when the client can unpickle it (forge_nb's
    own errors), else its type and message; the server's traceback either way (`%tb` shows it)."""

    type_name: str
    message: str
    traceback: str
    pickled: bytes | None = None

    @classmethod
    def of(cls, error: BaseException) -> Failure:
        text = "".join(traceback.format_exception(type(error), error, error.__traceback__))
        try:
            pickled = pickle.dumps(error)
            pickle.loads(pickled)
        except Exception:
            pickled = None
        return cls(f"{type(error).__module__}.{type(error).__qualname__}", str(error), text, pickled)

    def exception(self) -> BaseException:
        """The exception to raise in the client, with the server's traceback as its cause."""
        error: BaseException | None = None
        if self.pickled is not None:
            try:
                error = pickle.loads(self.pickled)
            except Exception:
                error = None
        if error is None:
            error = RemoteError(f"{self.type_name}: {self.message}")
        error.__cause__ = ServerTraceback(self.traceback)
        return error


class RemoteError(RuntimeError):
    """An exception of the server's that this process cannot rebuild: its type and message."""


class ServerTraceback(Exception):
    """Where an error came from in the session's server (shown as the cause of the error a client raises)."""

    def __str__(self) -> str:
        return "\n\nin the session's server:\n" + (self.args[0] if self.args else "")


@dataclass(frozen=True)
class RolloutView:
    """A batch made in the server, as a client sees it: a `handle` the server trains on (`train(view)`), and
    the batch's summary; its samples come as a table on request (`to_pandas`)."""

    handle: int
    session: str
    policy_version: int
    accuracy: float
    mean_reward: float
    tokens_per_s: float
    truncated: float
    generate_s: float
    score_s: float
    reference_s: float
    samples: int
    tokens: int
    summary: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True)
class RunView:
    """A background run as a client sees it (the run itself is the server's)."""

    state: str  # running, paused, finished, failed
    mode: str
    done: int
    steps: int | None
    error: str | None
    started_by: str
    produced: int = 0
    trained: int = 0
    dropped: int = 0
    unconsumed: int = 0
    staleness: dict[int, int] = field(default_factory=dict)
