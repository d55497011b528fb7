"""Where this user's sessions are found: one folder per session under the runtime folder, as Jupyter keeps its
kernels' connection files.

    <runtime>/NAME/
      socket      the server's Unix socket (0600): clients attach here with the key below
      key         the session's secret (0600): what a client proves it holds when it connects
      info.json   who the server is and what it runs: pid, host, model, mesh, step, versions, clients, state
      server.log  the server's output (moved into the run's folder when the session ends with `down`)

The runtime folder is ``$FORGE_NB_RUNTIME_DIR``, else ``$XDG_RUNTIME_DIR/forge_nb``, else
``~/.local/share/forge_nb/runtime``; it is refused when another user owns it, and made 0700 when others may enter
it. A session's folder goes when its server ends it; one whose server died (killed, its host rebooted) stays, and
`forge-nb ps` shows it as gone with its last checkpoint until `forge-nb down NAME` clears it. A server is known by
its pid and that process's start time (a pid given to another process since is not it).
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import socket
import stat
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import psutil

from forge_nb.private_files import write_private

INFO, SOCKET, KEY, LOG = "info.json", "socket", "key", "server.log"
CLAIM = ".claim"  # in the runtime folder: held while a name is picked and its folder made (`claiming`)
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")


class RegistryError(RuntimeError):
    """A session that cannot be found or attached, or a runtime folder that is not safe to use."""


def runtime_dir() -> Path:
    """This user's folder of sessions (made 0700 when missing; `RegistryError` when it is not private)."""
    explicit = os.environ.get("FORGE_NB_RUNTIME_DIR")
    xdg = os.environ.get("XDG_RUNTIME_DIR")
    folder = (
        Path(explicit) if explicit else Path(xdg) / "forge_nb" if xdg else Path.home() / ".local/share/forge_nb/runtime"
    )
    folder.mkdir(mode=0o700, parents=True, exist_ok=True)
    private(folder)
    return folder


@contextmanager
def locked(path: Path) -> Iterator[None]:
    """One process at a time in the block: an flock on `path` (made 0600 if missing)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # (the lock goes with it)


@contextmanager
def claiming() -> Iterator[None]:
    """One process at a time picks a free name and makes its folder (`locked` on the runtime folder's `CLAIM`):
    two scripts started together get two sessions, not one folder between them."""
    with locked(runtime_dir() / CLAIM):
        yield


def private(folder: Path) -> None:
    """`RegistryError` unless `folder` is this user's; made 0700 when others may enter it (a folder someone else
    made in a shared place could hand out a socket of theirs)."""
    info = folder.stat()
    if info.st_uid != os.getuid():
        raise RegistryError(f"forge_nb: {folder} belongs to uid {info.st_uid}, not to you; refusing to use it")
    if stat.S_IMODE(info.st_mode) & 0o077:
        os.chmod(folder, 0o700)


def valid_name(name: str) -> str:
    if not NAME.fullmatch(name):
        raise RegistryError(
            f"forge_nb: session name {name!r}: letters, digits, '.', '_' and '-' (at most 64; a letter or digit first)"
        )
    return name


@dataclass
class SessionInfo:
    """What `info.json` says of a session (the server rewrites it as the session moves on)."""

    name: str
    pid: int  # the server's (the starting process's until the server writes its own)
    host: str
    created: float
    state: str = "starting"  # starting, up, down, failed
    pid_started: float = 0.0  # that process's start time (psutil's create_time): a reused pid is not it
    model: str = ""
    task: str = ""
    mesh: str = ""
    engine: str = ""
    procs: int = 0
    step: int = 0
    policy_version: int = 0
    generator_version: int = 0
    reward_version: int = 0
    loss_version: int = 0
    run: str | None = None  # the background run's state, if any
    clients: list[str] = field(default_factory=list)
    run_dir: str = ""
    last_checkpoint: str | None = None
    idle_timeout_s: float = 0.0
    error: str | None = None
    updated: float = field(default_factory=time.time)

    @property
    def alive(self) -> bool:
        """Whether its server still runs (on this host: a server on another host sharing this folder is
        taken at its word)."""
        if self.host != socket.gethostname():
            return self.state in ("starting", "up")
        return same_process(self.pid, self.pid_started)

    def row(self) -> dict[str, Any]:
        """One line of `forge-nb ps`."""
        state = self.state if self.alive else "gone"
        return {
            "name": self.name,
            "state": state,
            "model": self.model,
            "mesh": f"{self.mesh} ({self.procs} procs)" if self.mesh else "",
            "step": self.step,
            "versions": f"policy v{self.policy_version} / reward v{self.reward_version} / loss v{self.loss_version}",
            "run": self.run or "",
            "clients": len(self.clients),
            "age": _age(time.time() - self.created),
            "pid": self.pid,
            "last_checkpoint": self.last_checkpoint or "",
        }


class SessionDir:
    """One session's folder (`path`) and what is in it."""

    def __init__(self, path: Path) -> None:
        self.path = path

    @classmethod
    def named(cls, name: str) -> SessionDir:
        return cls(runtime_dir() / valid_name(name))

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def socket(self) -> Path:
        return self.path / SOCKET

    @property
    def log(self) -> Path:
        return self.path / LOG

    def create(self) -> None:
        """Make the folder, a fresh secret and an info that says "starting" in this process's name, so the name
        is taken until the server writes its own (`RegistryError` if a live session or start holds it). Call it
        within `claiming()`."""
        self.path.mkdir(mode=0o700, exist_ok=True)
        private(self.path)
        old = self.info()
        if old is not None and old.alive:
            raise RegistryError(
                f"forge_nb: a session named {self.name!r} is running (pid {old.pid}); pick another name"
            )
        for stale in (SOCKET, INFO):
            (self.path / stale).unlink(missing_ok=True)
        write_private(self.path / KEY, os.urandom(32))
        me = psutil.Process()
        self.write_info(SessionInfo(self.name, me.pid, socket.gethostname(), time.time(), pid_started=me.create_time()))

    def key(self) -> bytes:
        try:
            return (self.path / KEY).read_bytes()
        except FileNotFoundError:
            raise RegistryError(f"forge_nb: no session named {self.name!r} (nothing at {self.path})") from None

    def info(self) -> SessionInfo | None:
        try:
            data = json.loads((self.path / INFO).read_text())
        except (FileNotFoundError, json.JSONDecodeError):
            return None
        known = {k: v for k, v in data.items() if k in SessionInfo.__dataclass_fields__}
        return SessionInfo(**known)

    def write_info(self, info: SessionInfo) -> None:
        """Replace info.json at once (a reader never sees half of it)."""
        info.updated = time.time()
        staging = self.path / f".{INFO}.{os.getpid()}"
        staging.write_text(json.dumps(asdict(info), indent=1))
        os.replace(staging, self.path / INFO)

    def remove(self, keep_log_in: Path | None = None) -> None:
        """The folder and what is in it (the server's log into `keep_log_in` when given)."""
        if keep_log_in is not None and self.log.exists():
            keep_log_in.mkdir(parents=True, exist_ok=True)
            os.replace(self.log, keep_log_in / LOG)
        for entry in self.path.iterdir() if self.path.exists() else ():
            entry.unlink(missing_ok=True)
        try:
            self.path.rmdir()
        except OSError:
            pass


def same_process(pid: int, started: float) -> bool:
    """Whether `pid` runs and is the process that started at `started` (0: not known, the pid alone) and not a
    zombie."""
    try:
        process = psutil.Process(pid)
        return (not started or abs(process.create_time() - started) < 1.0) and process.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def sessions() -> list[SessionDir]:
    """Every session folder of this user, oldest first."""
    found = [SessionDir(p) for p in runtime_dir().iterdir() if p.is_dir() and (p / INFO).exists()]
    return sorted(found, key=lambda d: d.info().created if d.info() else 0.0)


def _age(seconds: float) -> str:
    if seconds < 90:
        return f"{seconds:.0f} s"
    if seconds < 5400:
        return f"{seconds / 60:.0f} min"
    return f"{seconds / 3600:.1f} h"
