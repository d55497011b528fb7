"""A fork server per host worker (`mesh.kind` "hosts" or "slurm"), started by the first proc that asks.

On a local mesh the kernel starts the session's `ForkServer` itself. A mesh over several hosts starts its
procs through each host's Monarch worker (``forge_nb.launch.worker``, or the worker `SlurmJob` runs on each
node), which the kernel does not run and cannot ask to start anything but procs. So the procs' bootstrap
command there is ``python -m forge_nb.launch.forks.client --worker``: the client looks for the server of the
worker that started it (its parent) and, when there is none yet, binds the server's socket itself (under a
lock: the procs of a role start together) and starts the server on it. The server imports torch and
transformers once for every proc that worker starts, in this session and the next ones, and exits when
the worker does (a pidfd on it): it lives as long as the worker, like the procs it forks.

One server per (worker, host, Python executable, `IMPORT_ENV_PREFIXES` variables, torch's and transformers'
installed files): a proc whose import variables differ gets a server of its own, and so does a proc after
``pip install -U torch``. Hosts with GPUs do not fork (the kernel does not ask them to: `PlacedMesh`). A server
no proc has used for ``FORGE_NB_FORK_IDLE_S`` seconds (default `IDLE_S`) ends too: an idle worker does not
hold the ~400 MB of torch and transformers (RSS measured, 260 MB of it its own); the next proc starts one.
"""

from __future__ import annotations

import fcntl
import hashlib
import importlib.util
import json
import os
import select
import socket
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forge_nb.launch.forks.server import import_env, run_server, serve

FLAG = "--worker"  # forkclient's argument in place of a socket path
IDLE_ENV = "FORGE_NB_FORK_IDLE_S"
IDLE_S = 600.0  # a notebook's `%forge down` and next `%forge up` on the same workers usually come sooner
KEYED_PACKAGES = ("torch", "transformers")  # what the server imports: a new install is a new server


def folder() -> Path:
    """Where this user's worker servers keep their sockets (and lock files) on this host: a folder of this
    user's alone (one made by another user, or open to others, is refused: a client sends its environment
    and its standard streams to whoever listens there)."""
    path = Path(os.environ.get("XDG_RUNTIME_DIR") or tempfile.gettempdir()) / f"forge_nb-forks-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    info = os.lstat(path)
    if not stat.S_ISDIR(info.st_mode) or info.st_uid != os.getuid() or info.st_mode & 0o077:
        raise PermissionError(f"{path} is not a folder of this user's alone: procs start without a fork server")
    return path


def socket_path(worker: int, env: dict[str, str]) -> str:
    """The socket of the server for the worker with pid `worker` and procs with `env` on this host (short:
    a Unix socket's path has at most 107 bytes)."""
    installed = [_stamp(name) for name in KEYED_PACKAGES]
    key = json.dumps([socket.gethostname(), worker, sys.executable, installed, sorted(import_env(env).items())])
    return str(folder() / f"w{worker}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.sock")


def _stamp(package: str) -> list:
    """Where `package` is installed and when its files were written, found without importing it."""
    spec = importlib.util.find_spec(package)
    if spec is None or spec.origin is None:
        return [package, None]
    return [spec.origin, os.stat(spec.origin).st_mtime_ns]


def connect(worker: int) -> socket.socket | None:
    """A connection to the server of `worker` (this process's parent) for this process's environment,
    started here when it has none (or its socket is a dead one's) -> None when none can be started (the
    client then runs the proc itself)."""
    path = socket_path(worker, dict(os.environ))
    conn = _try(path)
    if conn is not None:
        return conn
    with _locked(path + ".lock"):
        conn = _try(path)  # another proc of the role started it while this one waited for the lock
        if conn is None:
            watched = os.pidfd_open(worker)
            try:
                if os.getppid() != worker:
                    return None  # the worker ended meanwhile (its pid may be another process's now)
                _start(path, watched)
            finally:
                os.close(watched)
            conn = _try(path)
    return conn


def _try(path: str) -> socket.socket | None:
    """One attempt: a listening server (or its socket's backlog, while it imports) -> the connection."""
    conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        conn.connect(path)
        return conn
    except OSError:
        conn.close()
        return None


@contextmanager
def _locked(path: str) -> Iterator[None]:
    with open(path, "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _idle_s() -> str:
    """``FORGE_NB_FORK_IDLE_S`` if it is a positive number of seconds, else `IDLE_S`."""
    try:
        idle = float(os.environ.get(IDLE_ENV) or IDLE_S)
    except ValueError:
        idle = IDLE_S
    return str(idle if idle > 0 else IDLE_S)


def _start(path: str, watched: int) -> None:
    """Bind and listen at `path` here (so a connection succeeds from now on), then hand the socket and the
    worker's pidfd `watched` to a new server: in a session of its own (a signal to the proc's group does
    not reach it) with no standard streams (a pipe Monarch reads a proc's output from stays its alone)."""
    try:
        os.unlink(path)  # a server that was killed (its worker's host lost) left its socket
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
        fd = listener.fileno()
        subprocess.Popen(
            [sys.executable, "-m", __name__, path, "--fd", str(fd), "--pidfd", str(watched), "--idle", _idle_s()],
            pass_fds=(fd, watched),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        listener.close()  # the server holds its own copy


# ---- the server process ---------------------------------------------------------------------------


def main() -> None:
    """``python -m forge_nb.launch.forks.on_workers PATH --fd N --pidfd P --idle S``: `forkserver.serve` on the
    socket a client bound (fd N) for the worker of pidfd P, idle S seconds at most."""
    path, options = sys.argv[1], dict(zip(sys.argv[2::2], sys.argv[3::2]))
    fd, watched = int(options["--fd"]), int(options["--pidfd"])
    ours = _identity(path)  # its client bound it, then started this server; held open, it is not reused

    def retire() -> None:
        """While the socket is still open (its file's identity cannot be reused): remove the file if it is
        still this server's, under the clients' lock (a client that found it gone has bound a new one
        there); and the lock file once the worker has ended (no proc of it can come)."""
        with _locked(path + ".lock"):
            if ours is not None and _identity(path) == ours:
                os.unlink(path)
        if _ended(watched):
            try:
                os.unlink(path + ".lock")
            except OSError:
                pass

    run_server(lambda: serve(path, fd, watched, float(options["--idle"]), retire))


def _identity(path: str) -> tuple[int, int] | None:
    try:
        info = os.stat(path)
    except OSError:
        return None
    return info.st_dev, info.st_ino


def _ended(pidfd: int) -> bool:
    """Whether the process of `pidfd` has ended (a zombie too: its pidfd is readable then)."""
    try:
        return bool(select.select([pidfd], [], [], 0)[0])
    except OSError:
        return True


if __name__ == "__main__":
    main()
