"""A fork server per host worker (`mesh.kind` "hosts" or "slurm"), started by the first proc that asks.

On a local mesh the kernel starts the session's `ForkServer` itself. A mesh over several hosts starts its
procs through each host's Monarch worker (``forge_nb.mesh.worker``, or the worker `SlurmJob` runs on each
node), which the kernel does not run and cannot ask to start anything but procs. So the procs' bootstrap
command there is ``python -m forge_nb.mesh.forkclient --worker``: the client looks for the server of the
worker that started it (its parent) and, when there is none yet, binds the server's socket itself (under a
lock: the procs of a role start together) and starts the server on it. The server imports torch and
transformers once for every proc that worker starts, in this session and the next ones, and exits when
the worker does (a pidfd on it): it lives as long as the worker, like the procs it forks.

One server per (worker, host, `IMPORT_ENV_PREFIXES` variables): a proc whose import variables differ gets
a server of its own. Hosts with GPUs do not fork (the kernel does not ask them to: `PlacedMesh`). A server
no proc has used for ``FORGE_NB_FORK_IDLE_S`` seconds (default `IDLE_S`) ends too: an idle worker does not
hold the ~400 MB of torch and transformers (RSS measured, 260 MB of it its own); the next proc starts one.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import select
import socket
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from forge_nb.mesh.forkserver import import_env, run_server, serve

FLAG = "--worker"  # forkclient's argument in place of a socket path
IDLE_ENV = "FORGE_NB_FORK_IDLE_S"
IDLE_S = 600.0  # a notebook's `%forge down` and next `%forge up` on the same workers usually come sooner


def folder() -> Path:
    """Where this user's worker servers keep their sockets (and lock files) on this host."""
    path = Path(tempfile.gettempdir()) / f"forge_nb-forks-{os.getuid()}"
    path.mkdir(mode=0o700, exist_ok=True)
    return path


def socket_path(worker: int, env: dict[str, str]) -> str:
    """The socket of the server for the worker with pid `worker` and procs with `env` on this host (short:
    a Unix socket's path has at most 107 bytes)."""
    key = json.dumps([socket.gethostname(), worker, sorted(import_env(env).items())])
    return str(folder() / f"w{worker}-{hashlib.sha1(key.encode()).hexdigest()[:16]}.sock")


def connect(worker: int) -> socket.socket | None:
    """A connection to the server of `worker` for this process's environment, started here when it has
    none (or its socket is a dead one's) -> None when none can be started (the client then runs the proc
    itself)."""
    path = socket_path(worker, dict(os.environ))
    conn = _try(path)
    if conn is not None:
        return conn
    with _locked(path + ".lock"):
        conn = _try(path)  # another proc of the role started it while this one waited for the lock
        if conn is None:
            try:
                _start(path, worker)
            except OSError:
                return None
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


def _start(path: str, worker: int) -> None:
    """Bind and listen at `path` here (so a connection succeeds from now on), then hand the socket to a
    new server that watches `worker`: in a session of its own (a signal to the proc's group does not
    reach it) with no standard streams (a pipe Monarch reads a proc's output from stays its alone)."""
    try:
        os.unlink(path)  # a server that was killed (its worker's host lost) left its socket
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        listener.bind(path)
        listener.listen(64)
        fd = listener.fileno()
        idle = os.environ.get(IDLE_ENV) or str(IDLE_S)
        subprocess.Popen(
            [sys.executable, "-m", __name__, path, "--fd", str(fd), "--watch", str(worker), "--idle", idle],
            pass_fds=(fd,),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
        )
    finally:
        listener.close()  # the server holds its own copy


# ---- the server process ---------------------------------------------------------------------------


def main() -> None:
    """``python -m forge_nb.mesh.workerforks PATH --fd N --watch PID --idle S``: `forkserver.serve` on the
    socket a client bound (fd N), for the worker with pid PID, idle S seconds at most."""
    path, options = sys.argv[1], dict(zip(sys.argv[2::2], map(float, sys.argv[3::2])))
    fd, watch = int(options["--fd"]), int(options["--watch"])
    ours = os.stat(path).st_ino  # the socket file this server answers at (its client bound it, then started it)

    def start():
        try:
            return serve(path, fd, watch, options["--idle"])
        except OSError:  # the worker ended before this server watched it
            return None

    run_server(start, lambda: _retire(path, ours, worker_gone=_ended(watch)))


def _retire(path: str, ours: int, worker_gone: bool) -> None:
    """Remove this server's socket file, if it is still this server's (a client that found this server
    gone, idle, may have bound a new one there: under the lock, so not between the check and the removal);
    and the lock file once the worker is gone (no proc of it can come)."""
    with _locked(path + ".lock"):
        try:
            if os.stat(path).st_ino == ours:
                os.unlink(path)
        except OSError:
            pass
    if worker_gone:
        try:
            os.unlink(path + ".lock")
        except OSError:
            pass


def _ended(pid: int) -> bool:
    """Whether process `pid` has ended (a zombie too: its pidfd is readable then)."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        return bool(select.select([fd], [], [], 0)[0])
    finally:
        os.close(fd)


if __name__ == "__main__":
    main()
