"""Starting a session's server, attaching to one, listing and ending them: what `forge_nb.up`, `forge_nb.attach`,
`forge_nb.resume`, `%forge up / attach / down` and `forge-nb ps / down` do.

A session started in a notebook is named after the notebook (``01_quickstart-3fa2``: its file's name and a short
hash of its path), so that the notebook's `%forge up` after a kernel restart finds it and attaches instead of
starting a second one; a script's session gets a free name of its own (``train-1``), or the name it asks for.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pandas as pd
import psutil

from forge_nb.config import Config, ConfigError
from forge_nb.errors import SessionError
from forge_nb.private_files import write_private
from forge_nb.server import zygote
from forge_nb.server.client import SessionClient, SessionGone, attach_to
from forge_nb.server.protocol import REQUEST, StartRequest
from forge_nb.server.registry import (
    RegistryError,
    SessionDir,
    claiming,
    runtime_dir,
    same_process,
    sessions,
    valid_name,
)

SOCKET_WAIT_S = 120.0  # a server that has not opened its socket by then is not coming (its log says why)


def in_kernel() -> bool:
    return "ipykernel" in sys.modules


def notebook_name() -> str | None:
    """The name of the notebook this kernel runs, as a session name (None outside a notebook)."""
    path = os.environ.get("JPY_SESSION_NAME")
    if not path:
        return None
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", Path(path).stem)[:48].strip("-.") or "notebook"
    digest = hashlib.sha1(str(Path(path).expanduser().resolve()).encode()).hexdigest()[:4]
    return f"{stem}-{digest}"


def free_name(base: str) -> str:
    """`base`, or `base-2`, `base-3`, ...: the first not used by a running session."""
    taken = {d.name for d in sessions() if d.info() is not None and d.info().alive}
    stem = re.sub(r"[^A-Za-z0-9_.-]", "-", base)[:48].strip("-.") or "session"
    for n in range(1, 10_000):
        name = stem if n == 1 else f"{stem}-{n}"
        if name not in taken:
            return name
    raise RegistryError("forge_nb: no free session name")


def start(request: StartRequest, name: str, persist: bool, client_class: type = SessionClient,
          pick_free: bool = False) -> SessionClient:  # fmt: skip
    """Start a server for `request` under `name` (`pick_free`: the first free name from it, `free_name`) and
    attach -> the client, once the session is up (its start's error raised here, with the server's log)."""
    with claiming():  # the name is picked and taken in one step
        _wait_gone_down(SessionDir.named(name))  # `down` then `up` (Restart and Run All): the same name again
        folder = SessionDir.named(free_name(name) if pick_free else name)
        folder.create()
    write_private(folder.path / REQUEST, pickle.dumps(request))
    process = _start_server(folder)
    try:
        _wait_listening(folder, process)
    except BaseException:  # (Ctrl-C too) a server no one will hold is not left to start a session
        _signal_down(process.pid, grace_s=5.0)
        folder.remove()
        raise
    client = client_class(folder, persist)
    try:
        client.wait_up()
    except SessionGone:
        raise SessionError(
            f"forge_nb: the session's server ended while starting ({_exit_of(process)}):\n{_tail(folder.log)}"
        ) from None
    except BaseException:
        _end(folder)  # a start that failed leaves nothing running
        raise
    from forge_nb.runtime import lifecycle

    lifecycle.register(client)
    return client


def _start_server(folder: SessionDir) -> subprocess.Popen | ForkedServer:
    """The server of the session at `folder`: forked by this context's zygote (`zygote`: its imports done), else
    ``python -m forge_nb.server FOLDER`` started here. Either way in a session of its own, logging to its folder."""
    pid = zygote.spawn(folder.path)
    if pid is not None:
        return ForkedServer(pid)
    with open(folder.log, "ab") as log:
        return subprocess.Popen(
            [sys.executable, "-m", "forge_nb.server", str(folder.path)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # not in the kernel's process group: a kernel restart does not reach it
            close_fds=True,
        )


class ForkedServer:
    """What `start` watches of a server a zygote forked (its child, not this process's): `pid`, and `poll`."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.started = psutil.Process(pid).create_time() if psutil.pid_exists(pid) else 0.0

    def poll(self) -> int | None:
        """None while it runs; -1 once it ended (its exit status is the zygote's to collect)."""
        return None if same_process(self.pid, self.started) else -1


def _exit_of(process: subprocess.Popen | ForkedServer) -> str:
    code = process.poll()
    return "its exit status is in the log" if isinstance(process, ForkedServer) else f"exit {code}"


def _wait_gone_down(folder: SessionDir, timeout: float = 30.0) -> None:
    """While the session at `folder` is going down (its server's last seconds after `down`), wait for it to end."""
    deadline = time.monotonic() + timeout
    while (info := folder.info()) is not None and info.state == "down" and info.alive:
        if time.monotonic() > deadline:
            return
        time.sleep(0.1)


def _wait_listening(folder: SessionDir, process: subprocess.Popen | ForkedServer) -> None:
    """Until the server writes its info, which it does once it listens (the socket's file exists from bind(),
    before listen(), and a client that connects between them is refused)."""
    deadline = time.monotonic() + SOCKET_WAIT_S
    while (info := folder.info()) is None or info.pid != process.pid:
        if process.poll() is not None or time.monotonic() > deadline:
            raise SessionError(f"forge_nb: the session's server did not start:\n{_tail(folder.log)}")
        time.sleep(0.05)


def up(
    config: Config | None,
    overrides: dict[str, Any],
    data: Any,
    name: str | None,
    new: bool,
    persist: bool | None,
    client_class: type = SessionClient,
) -> SessionClient:
    """See `forge_nb.up`."""
    cfg = (config or Config()).updated(overrides)  # a config error is raised here, before any process starts
    persist = in_kernel() if persist is None else persist
    own = notebook_name()
    if name is None and own is not None and not new:
        existing = SessionDir.named(own)
        info = existing.info()
        if info is not None and info.alive and info.state == "up":
            client = attach_to(existing, persist=True, client_class=client_class)
            if client.config != cfg:
                client.detach()
                raise ConfigError(
                    f"forge_nb: this notebook's session {own!r} is running with another config; %forge attach to "
                    f"use it, %forge down to end it, or %forge up --new to start another beside it"
                )
            print(f"forge_nb: attached to this notebook's running session {own!r} (step {client.step_count})")
            return client
    if name is not None:
        valid_name(name)
    request = StartRequest(cfg, data, owner=None if persist else _this_process())
    return start(request, name or (own or ("kernel" if in_kernel() else _script_name())), persist, client_class,
                 pick_free=name is None)  # fmt: skip


def resume(path: str | Path, overrides: dict[str, Any] | None = None, name: str | None = None,
           persist: bool | None = None, client_class: type = SessionClient) -> SessionClient:  # fmt: skip
    """See `forge_nb.resume`: a new server that goes on from the checkpoint at `path`."""
    persist = in_kernel() if persist is None else persist
    base = name or (notebook_name() or ("kernel" if in_kernel() else _script_name())) + "-resumed"
    owner = None if persist else _this_process()
    request = StartRequest(
        Config(), resume_from=str(Path(path).expanduser().resolve()), overrides=overrides, owner=owner
    )
    return start(request, base, persist, client_class, pick_free=name is None)


def attach(name: str | None = None, client_class: type = SessionClient) -> SessionClient:
    """See `forge_nb.attach`."""
    if name is None:
        running = [d for d in sessions() if d.info() is not None and d.info().alive]
        own = notebook_name()
        mine = [d for d in running if d.name == own]
        if mine:
            return attach_to(mine[0], client_class=client_class)
        if len(running) != 1:
            names = ", ".join(d.name for d in running) or "none"
            raise RegistryError(f"forge_nb: say which session to attach to (running: {names})")
        return attach_to(running[0], client_class=client_class)
    return attach_to(SessionDir.named(name), client_class=client_class)


def ps() -> pd.DataFrame:
    """This user's sessions: name, state (starting, up, down: going down, failed, gone), model, mesh, step,
    versions, run, clients, age, pid, last checkpoint."""
    rows = [info.row() for d in sessions() if (info := d.info()) is not None]  # (read once: it may go meanwhile)
    columns = ["name", "state", "model", "mesh", "step", "versions", "run", "clients", "age", "pid", "last_checkpoint"]
    return pd.DataFrame(rows, columns=columns).set_index("name")


def down(names: list[str] | None = None) -> list[str]:
    """End the named sessions (None: every one of this user's, and the zygotes that fork their servers) and clear
    the folders of those gone -> what was done, a line each."""
    folders = sessions() if names is None else [SessionDir.named(n) for n in names]
    done = [_end(folder) for folder in folders]
    if names is None:  # every session: the zygotes that would fork the next ones go too
        done += [f"zygote {pid}: ended" for pid in zygote.stop_all()]
    return done


def _end(folder: SessionDir) -> str:
    info = folder.info()
    if info is None and not folder.path.exists():
        return f"{folder.name}: no such session"
    if info is None or not info.alive:
        folder.remove()
        return f"{folder.name}: gone; its folder cleared"
    try:
        client = SessionClient(folder, persist=True)
        client.down()
        return f"{folder.name}: down"
    except Exception as e:  # a server that cannot answer is stopped by signal: its procs go with it
        _signal_down(info.pid, started=info.pid_started)
        folder.remove()
        return f"{folder.name}: its server did not answer ({type(e).__name__}: {e}); stopped by signal"


def _signal_down(pid: int, grace_s: float = 60.0, started: float = 0.0) -> None:
    """SIGTERM, then SIGKILL after `grace_s`, to the server `pid` (started at `started`: not a process that
    reuses its pid). SIGTERM ends the session as `down` does; the grace lets a Slurm session's cancel finish."""
    try:
        process = psutil.Process(pid)
        if not same_process(pid, started) or "forge_nb.server" not in process.cmdline():
            return  # not a server: a start's own process, while its server comes up, or a pid reused
        process.send_signal(signal.SIGTERM)
        process.wait(grace_s)
    except psutil.TimeoutExpired:
        process.kill()
    except psutil.Error:
        pass


def _this_process() -> tuple[int, float]:
    return os.getpid(), psutil.Process().create_time()


def _script_name() -> str:
    script = Path(sys.argv[0]).stem if sys.argv and sys.argv[0] and sys.argv[0] != "-c" else ""
    return script or "session"


def _tail(log: Path, lines: int = 30) -> str:
    try:
        text = log.read_text(errors="replace").splitlines()
    except FileNotFoundError:
        return "(no log)"
    return "\n".join(text[-lines:])


__all__ = ["attach", "down", "ps", "resume", "runtime_dir", "start", "up"]
