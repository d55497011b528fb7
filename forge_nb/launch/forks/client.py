"""A proc's bootstrap command: ``python -m forge_nb.launch.forks.client <socket>|--worker [module]``.

Monarch's host agent starts this process as the proc and supervises it; it asks the session's
`forkserver` (which has torch and transformers imported) for a child that runs the proc with this
process's environment, directory and standard descriptors, forwards every signal it gets to that
child, and exits as the child did. Without a server to answer (it did not start, or ended), it
becomes the proc itself: ``exec`` of Monarch's proc main, the command Monarch runs by default.
A local mesh names its session's server's socket; a mesh over several hosts says ``--worker``: the
server of the host's worker that started this process (`workerforks`), which the first proc starts.
Imports nothing heavy: its own start is the whole cost of a proc's start here.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import time

from forge_nb.launch.forks import on_workers as workerforks
from forge_nb.launch.forks.server import BOOTSTRAP_MAIN, request  # light: the server module imports no torch

CONNECT_TIMEOUT_S = 30.0  # the server binds its socket first thing; a slow start is the imports, after it
FORK_TIMEOUT_S = 120.0  # the server's imports then the fork: ~4 s alone, a few times that on busy cores
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGQUIT, signal.SIGUSR1, signal.SIGUSR2)


def main(path: str, module: str = BOOTSTRAP_MAIN) -> None:
    """Run `module` as ``__main__`` in a child of the server at `path` (itself, without a server); `path`
    ``--worker``: the server of the host worker that started this process (`workerforks`: started now
    if it has none)."""
    conn = _connect(path) if path != workerforks.FLAG else _worker_server()
    if conn is None:
        _exec_plain(module)
    try:
        socket.send_fds(conn, [request(dict(os.environ), os.getcwd(), module)], [0, 1, 2])
        conn.settimeout(FORK_TIMEOUT_S)
        lines = conn.makefile("rb")
        first = lines.readline().split()
        conn.settimeout(None)  # the proc's whole life, until its exit line
    except OSError:  # (a timeout too: this process then runs the proc; the late child's lifeline ends it)
        first = []
    if len(first) != 2 or first[0] != b"pid":
        _exec_plain(module)  # the server ended before it forked: nothing started yet
    child = int(first[1])
    for sig in FORWARDED:
        signal.signal(sig, lambda sig, _frame: _forward(child, sig))
    _end_as(lines.readline().split())


def _connect(path: str) -> socket.socket | None:
    """A connection to the server at `path`, or None: its folder is gone, or no one listens there (a
    server that died: refused for a second; one starting binds its socket within CONNECT_TIMEOUT_S)."""
    deadline = time.monotonic() + CONNECT_TIMEOUT_S
    while True:
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
            return conn
        except ConnectionRefusedError:  # the socket is there, no one listens (between bind and listen: briefly)
            deadline = min(deadline, time.monotonic() + 1.0)
        except OSError:
            pass
        conn.close()
        if not os.path.exists(os.path.dirname(path)) or time.monotonic() > deadline:
            return None
        time.sleep(0.02)


def _worker_server() -> socket.socket | None:
    if not sys.platform.startswith("linux"):
        return None  # fork after the imports is tested on Linux only (a macOS host's libraries do not survive it)
    try:
        return workerforks.connect(os.getppid())
    except OSError:
        return None


def _forward(child: int, sig: int) -> None:
    try:
        os.kill(child, sig)
    except ProcessLookupError:
        pass


def _end_as(last: list[bytes]) -> None:
    """Exit as the child did: "exit N" -> N, "signal N" -> killed by N (end of file: the server died
    and cannot say; the child may still run, and its lifeline ends it when this process exits)."""
    if len(last) == 2 and last[0] == b"signal":
        sig = int(last[1])
        if sig in FORWARDED:
            signal.signal(sig, signal.SIG_DFL)  # (SIGKILL has no handler to reset)
        os.kill(os.getpid(), sig)
    sys.exit(int(last[1]) if len(last) == 2 and last[0] == b"exit" else 1)


def _exec_plain(module: str) -> None:
    os.execv(sys.executable, [sys.executable, "-m", module])


if __name__ == "__main__":
    main(*sys.argv[1:3])
