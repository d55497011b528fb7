"""The fork server of one session (see `launch.forks` for what it saves): one process imports torch and
transformers once, then forks every proc of the session, so a proc does not import them again.

Monarch still starts each proc (its host agent runs the proc's bootstrap command and supervises that
process); the command is `forge_nb.launch.forks.client`, which hands its environment, working directory
and standard descriptors to this server over a Unix socket. The server forks a child that takes them
on and runs Monarch's own proc main (`monarch._src.actor.bootstrap_main`), the same code a fresh
interpreter runs. The client stays the process Monarch knows: it forwards the signals it gets to the
child and exits as the child did; the child kills itself when its client is gone (SIGKILL included).

Forking after importing torch is what PyTorch's DataLoader workers do; the server never runs a torch
op (its OpenMP pool, which a fork cannot carry, does not exist yet) and never imports Monarch (whose
runtime starts threads). Only hosts without GPUs fork (`LocalMesh`): a GPU proc must initialise the
CUDA driver itself, under its own ``CUDA_VISIBLE_DEVICES``. The heap the server imported is frozen
before the first fork and a child exits as multiprocessing's forked children do: a collection over it,
or the interpreter's teardown of it, would write to every inherited page (copy on write).

The server belongs to one `LocalMesh` (one session): `release` stops it with the mesh, unless
``FORGE_NB_FORK_LINGER_S`` keeps it that many seconds for the process's next session (`acquire`: a
notebook's down and up, the test suite's sessions; then `up()` imports nothing). It exits by itself when
its standard input closes (the process that started it is gone, however it ended). A host worker's server
(`forge_nb.launch.forks.on_workers`, meshes over several hosts) is this program too, started by the worker's
first proc on a socket that proc bound (``--fd``); it exits when the worker does (its pidfd, ``--pidfd``).
"""

from __future__ import annotations

import atexit
import contextlib
import gc
import json
import os
import selectors
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable
from pathlib import Path

#: What a model proc imports on its way to a loaded model (measured with ``python -X importtime``):
#: torch, then transformers' auto classes, which bring modeling_utils and generation; then forge_nb's trainer
#: (`Policy`: FSDP2, DTensor, which the trainer and the reference each imported again) and torch engine. None of
#: them imports Monarch.
PRELOAD = (
    "torch",
    "torch.distributed",
    "transformers",
    "transformers.modeling_utils",
    "transformers.models.auto.modeling_auto",
    "transformers.models.auto.tokenization_auto",
    "transformers.models.llama.modeling_llama",  # the bundled model's (and SmolLM2's) architecture
    "safetensors.torch",
    "forge_nb.parallel.policy",
    "forge_nb.engines.torch_engine",
)
BOOTSTRAP_MAIN = "monarch._src.actor.bootstrap_main"
#: How long a mesh waits for a new server's imports before it asks Monarch for procs (`ForkServer.wait_ready`):
#: as long as a client waits for its fork (`client.FORK_TIMEOUT_S`); ~4 s alone, 20-30 s on 2 loaded cores.
READY_TIMEOUT_S = 120.0
_LEN = struct.Struct("!I")


def request(env: dict[str, str], cwd: str, module: str = BOOTSTRAP_MAIN) -> bytes:
    """A client's request: its environment, working directory and the module the child runs as
    ``__main__`` (Monarch's proc main), length-prefixed JSON."""
    body = json.dumps({"env": env, "cwd": cwd, "module": module}).encode()
    return _LEN.pack(len(body)) + body


def forks_wanted() -> bool:
    """Whether procs may fork from a fork server at all: unless ``FORGE_NB_FORK_PROCS=0``."""
    return os.environ.get("FORGE_NB_FORK_PROCS", "1") != "0"


def forks_here() -> bool:
    """Whether procs of this host may fork from a fork server here: `forks_wanted`, on Linux (macOS's system
    libraries do not survive a fork after they start)."""
    return forks_wanted() and sys.platform.startswith("linux")


class ForkServer:
    """The kernel's handle on a running server: `command_args` for procs' bootstrap, `stop` to end it."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        """Start the server (returns at once; it imports meanwhile: `wait_ready`, and clients wait in its backlog).
        `env`: variables on top of this process's that procs get (and the imports see)."""
        self.env = {**os.environ, **(env or {})}
        self.folder = Path(tempfile.mkdtemp(prefix="forge_nb-forks-"))
        self.path = str(self.folder / "sock")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "forge_nb.launch.forks.server", self.path],
            stdin=subprocess.PIPE,  # closed when this process ends, however it ends: the server exits then
            env=self.env,
        )
        self.expiry: threading.Timer | None = None  # while it lingers, idle (`release`)
        self.ready = False  # its imports are done: it forks at once (`wait_ready`)

    @classmethod
    def forked(cls) -> ForkServer:
        """A server forked from this process, which has imported `PRELOAD` and started no thread a fork cannot
        carry (no Monarch yet: `launch.forks.early`) -> its handle, ready at once: no interpreter starts and
        nothing is imported again. Procs get this process's environment (as `ForkServer()` gives its own). It
        ends with this process (its pidfd), or on `stop`."""
        server = cls.__new__(cls)
        server.env, server.expiry, server.ready = dict(os.environ), None, False
        server.folder = Path(tempfile.mkdtemp(prefix="forge_nb-forks-"))
        server.path = str(server.folder / "sock")
        parent = os.getpid()
        pid = os.fork()
        if pid == 0:  # the server: never returns into the code that forked it
            try:
                watched = os.pidfd_open(parent)
                run_server(lambda: serve(server.path, watched=watched, retire=lambda: _remove_socket(server.path)))
            finally:
                os._exit(1)
        server.proc = _Forked(pid)
        return server

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> bool:
        """Wait until the server has imported `PRELOAD` and forks at once, `timeout` s at most -> whether it
        does (False once it has ended). A mesh waits here before it asks Monarch for procs: Monarch gives a proc
        30 s to start (``mesh_proc_spawn_max_idle``), and a proc asked of a server still importing spends the
        imports in those 30 s (two sessions starting at once on 2 loaded cores: the imports took 22 and 28 s,
        and the second session failed to start)."""
        deadline = time.monotonic() + timeout
        while not self.ready and self.proc.poll() is None and time.monotonic() < deadline:
            self.ready = _serving(self.path, deadline - time.monotonic())
            if not self.ready:
                time.sleep(0.05)
        return self.ready and self.proc.poll() is None

    def command_args(self) -> list[str]:
        """Arguments (after the Python executable) of the bootstrap command that starts a proc here."""
        return ["-m", "forge_nb.launch.forks.client", self.path]

    def stop(self, timeout: float = 5.0) -> None:
        """End the server (its forked procs are Monarch's to stop, before this) and remove its socket."""
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if self.proc.stdin is not None:
            self.proc.stdin.close()
        shutil.rmtree(self.folder, ignore_errors=True)


class _Forked:
    """The `subprocess.Popen` calls a `ForkServer` makes, for a server forked from this process (`forked`)."""

    stdin = None

    def __init__(self, pid: int) -> None:
        self.pid, self.returncode = pid, None

    def poll(self) -> int | None:
        if self.returncode is None:
            with contextlib.suppress(ChildProcessError):
                pid, status = os.waitpid(self.pid, os.WNOHANG)
                if pid == 0:
                    return None
                self.returncode = os.waitstatus_to_exitcode(status)
            if self.returncode is None:  # reaped by someone else (a SIGCHLD handler): it ended
                self.returncode = -1
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while (code := self.poll()) is None:
            if deadline is not None and time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(f"fork server {self.pid}", timeout or 0.0)
            time.sleep(0.02)
        return code

    def terminate(self) -> None:
        self._signal(signal.SIGTERM)

    def kill(self) -> None:
        self._signal(signal.SIGKILL)

    def _signal(self, signum: int) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signum)


# ---- one server between sessions: FORGE_NB_FORK_LINGER_S --------------------------------------------

LINGER_ENV = "FORGE_NB_FORK_LINGER_S"
#: Variables the server's imports can read (thread pools, devices, caches, paths, the libraries' own switches):
#: a lingering server serves a mesh only when these are as when it started. Others (PYTEST_CURRENT_TEST, a
#: job's id) differ between sessions and matter only to the procs, which get the client's environment anyway.
IMPORT_ENV_PREFIXES = (
    "OMP_", "GOMP_", "KMP_", "MKL_", "OPENBLAS_", "TORCH", "PYTORCH_", "CUDA", "NCCL_", "NVIDIA_", "TRITON_",
    "HF_", "HUGGINGFACE_", "TRANSFORMERS_", "TOKENIZERS_", "SAFETENSORS_", "PYTHON", "LD_", "VIRTUAL_ENV",
    "PATH", "HOME", "TMPDIR", "XDG_",
)  # fmt: skip
_lock = threading.Lock()
_idle: ForkServer | None = None  # the server a mesh gave back, lingering for the next one


def acquire(env: dict[str, str]) -> ForkServer:
    """A fork server for a mesh whose procs get `env` on top of this process's: the lingering one when it
    started with the same `IMPORT_ENV_PREFIXES` variables (what its imports saw), else a new one."""
    global _idle
    with _lock:
        idle, _idle = _idle, None
    if idle is not None:
        if idle.expiry is not None:
            idle.expiry.cancel()
        if import_env(idle.env) == import_env({**os.environ, **env}) and idle.proc.poll() is None:
            return idle
        idle.stop()
    return ForkServer(env)


def import_env(env: dict[str, str]) -> dict[str, str]:
    """The variables of `env` that the server's imports can read (`IMPORT_ENV_PREFIXES`)."""
    return {k: v for k, v in env.items() if k.startswith(IMPORT_ENV_PREFIXES)}


def release(server: ForkServer) -> None:
    """The mesh that had `server` stopped: stop it, or, with ``FORGE_NB_FORK_LINGER_S`` > 0, keep it that
    many seconds for the next session of this process (the suite's sessions, or a notebook's down and
    up: one import of torch and transformers less each). It ends with this process either way."""
    global _idle
    linger = float(os.environ.get(LINGER_ENV) or 0)
    if linger <= 0 or server.proc.poll() is not None:
        server.stop()
        return
    server.expiry = threading.Timer(linger, _expire, (server,))
    server.expiry.daemon = True
    try:
        server.expiry.start()
    except RuntimeError:  # no new thread at interpreter exit (the mesh stopped by the atexit hook)
        server.stop()
        return
    with _lock:
        old, _idle = _idle, server
    if old is not None:
        old.stop()


def offer(server: ForkServer) -> None:
    """Make `server` the one the next `acquire` takes (its environment permitting): a server forked before the
    process's first session (`launch.forks.early`). It waits for no `FORGE_NB_FORK_LINGER_S`: `stop_unused` ends it
    when no mesh took it."""
    global _idle
    with _lock:
        old, _idle = _idle, server
    if old is not None:
        old.stop()


def stop_unused(server: ForkServer) -> None:
    """Stop `server` if it is still the one waiting for a mesh (`offer`): the session's procs did not fork (GPUs, or
    an environment its imports did not see)."""
    global _idle
    with _lock:
        if _idle is not server:
            return
        _idle = None
    server.stop()


def idle_pids() -> list[int]:
    """The pid of the lingering server, if one lingers (a no-process-left check leaves it out)."""
    idle = _idle
    return [idle.proc.pid] if idle is not None and idle.proc.poll() is None else []


def _expire(server: ForkServer) -> None:
    global _idle
    with _lock:
        if _idle is not server:
            return  # taken again meanwhile
        _idle = None
    server.stop()


def _stop_idle() -> None:
    global _idle
    with _lock:
        idle, _idle = _idle, None
    if idle is not None:
        idle.stop()


atexit.register(_stop_idle)


# ---- the server process ---------------------------------------------------------------------------


def serve(
    path: str,
    fd: int | None = None,
    watched: int | None = None,
    idle: float | None = None,
    retire: Callable[[], None] | None = None,
) -> Callable[[], None] | None:
    """Listen at `path` (or on the listening socket `fd`, bound there by the client that started this
    server), import `PRELOAD`, fork a proc per request -> in a forked child, the function that runs the
    proc; in the server, None once it is told to stop, or its standard input closes (`watched` None: the
    kernel that started it is gone), or the process of the pidfd `watched` (a host's worker) has ended,
    or no proc of it has run for `idle` seconds. `retire` runs then, before the socket closes."""
    if fd is None:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(path)
        listener.listen(64)  # clients that come during the imports wait here
    else:
        listener = socket.socket(fileno=fd)
    for name in PRELOAD:
        with contextlib.suppress(Exception):  # a missing optional piece: the proc imports what it needs itself
            __import__(name)
    # Out of every collection from now on, in the children too: a collection in a child would otherwise
    # walk (and write to) every inherited object, copying the heap page by page (0.5 s a proc, measured).
    gc.collect()
    gc.freeze()
    wake_r, wake_w = socket.socketpair()
    wake_r.setblocking(False)
    wake_w.setblocking(False)
    signal.set_wakeup_fd(wake_w.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a child ended: the wakeup socket says so
    signal.signal(signal.SIGTERM, lambda *_: None)  # ends the loop through the wakeup socket
    stopping = False
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "accept")
    selector.register(wake_r, selectors.EVENT_READ, "wake")
    if watched is None:
        selector.register(sys.stdin.fileno(), selectors.EVENT_READ, "stdin")
    else:
        selector.register(watched, selectors.EVENT_READ, "watched")
    clients: dict[int, socket.socket] = {}  # child pid -> its client's connection
    idle_since = time.monotonic()
    while not stopping:
        timeout = None if clients or idle is None else max(0.0, idle_since + idle - time.monotonic())
        events = selector.select(timeout)
        stopping = not events and not clients  # (only with a timeout: idle that long)
        for key, _ in events:
            if key.data == "stdin" and not os.read(sys.stdin.fileno(), 4096) or key.data == "watched":
                stopping = True  # the process that started this one (or the worker it serves) is gone
            elif key.data == "wake":
                signals = wake_r.recv(4096)
                stopping = stopping or signal.SIGTERM in signals
                _reap(clients)
                idle_since = time.monotonic()
            elif key.data == "accept":
                conn, _ = listener.accept()
                got = _read_request(conn)
                if got is None:
                    conn.close()
                    continue
                try:
                    pid = os.fork()
                except OSError:  # out of processes or memory: this client starts its proc itself
                    for passed in got[1]:
                        os.close(passed)
                    conn.close()
                    continue
                if pid == 0:  # the child: drop the server's state, become the proc
                    signal.set_wakeup_fd(-1)
                    selector.close()
                    for other in (listener, wake_r, wake_w, *clients.values()):
                        other.close()
                    if watched is not None:
                        os.close(watched)
                    return lambda: _become_proc(conn, *got)
                for passed in got[1]:  # the child's now; kept here, a client's pipes would never see end of file
                    os.close(passed)
                clients[pid] = conn
                _send(conn, f"pid {pid}")
    if retire is not None:
        retire()
    listener.close()
    return None


def _serving(path: str, timeout: float) -> bool:
    """Whether the server at `path` serves, within `timeout` s: it accepts connections only once its imports are
    done, and closes one that sends nothing (no request: `_read_request`) -> False while it is not bound yet."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(max(timeout, 0.01))
        try:
            conn.connect(path)  # (waits in the backlog while the server imports)
            conn.shutdown(socket.SHUT_WR)
            return conn.recv(1) == b""
        except OSError:  # not bound or not listening yet, or no answer in time
            return False


def _read_request(conn: socket.socket) -> tuple[dict, list[int]] | None:
    """The request on `conn` and the three descriptors that came with it, or None (a client that left)."""
    conn.settimeout(10.0)
    try:
        data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
        if len(data) < _LEN.size or len(fds) != 3:
            return None
        size = _LEN.unpack_from(data)[0]
        while len(data) < _LEN.size + size:
            more = conn.recv(1 << 16)
            if not more:
                return None
            data += more
    except OSError:
        return None
    conn.settimeout(None)
    return json.loads(data[_LEN.size :]), fds


def _reap(clients: dict[int, socket.socket]) -> None:
    """Tell each finished child's client how it ended ("exit N" or "signal N")."""
    while clients:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        conn = clients.pop(pid, None)
        if conn is None:
            continue
        if os.WIFSIGNALED(status):
            _send(conn, f"signal {os.WTERMSIG(status)}")
        else:
            _send(conn, f"exit {os.waitstatus_to_exitcode(status)}")
        conn.close()


def _send(conn: socket.socket, line: str) -> None:
    with contextlib.suppress(OSError):  # the client is gone; its child's lifeline ends the child
        conn.sendall(line.encode() + b"\n")


def _become_proc(conn: socket.socket, got: dict, fds: list[int]) -> None:
    """In the forked child: take on the client's descriptors, environment and directory, watch the
    client, and run the module asked for (Monarch's proc main) as ``python -m`` would."""
    import runpy

    for sig in (signal.SIGCHLD, signal.SIGTERM):
        signal.signal(sig, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(got["env"])
    os.chdir(got["cwd"])
    sys.path[0] = got["cwd"]  # as `python -m` in that directory puts it first (a lingering server started elsewhere)
    threading.Thread(target=_lifeline, args=(conn,), name="forge_nb-lifeline", daemon=True).start()
    sys.argv = [got["module"]]
    code: int | str | None = 0
    try:
        runpy.run_module(got["module"], run_name="__main__", alter_sys=True)
    except SystemExit as e:
        code = e.code
    except BaseException:
        traceback.print_exc()
        code = 1
    _exit(code)


def _exit(code: int | str | None) -> None:
    """End the forked proc as multiprocessing ends a forked child: threads joined, exit handlers run,
    output flushed, then `os._exit`. The interpreter's own teardown would collect and free the whole
    inherited heap (writing to every page of it: 1.2 s a proc, measured) only to exit."""
    threading._shutdown()  # type: ignore[attr-defined]  # what the interpreter does first at exit
    atexit._run_exitfuncs()
    if isinstance(code, str):
        print(code, file=sys.stderr)
        code = 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code or 0)


def _lifeline(conn: socket.socket) -> None:
    """The client never writes after its request: end of file means it is gone (killed): go with it."""
    with contextlib.suppress(OSError):
        while conn.recv(64):
            pass
    os.kill(os.getpid(), signal.SIGKILL)


def _remove_socket(path: str) -> None:
    """Remove the socket and its folder, the folder only when nothing else is in it (never a tree: PATH is argv)."""
    with contextlib.suppress(OSError):
        os.unlink(path)
        os.rmdir(os.path.dirname(path))


def main() -> None:
    """``python -m forge_nb.launch.forks.server PATH``: a kernel's server (`ForkServer`); it removes its socket."""
    run_server(lambda: serve(sys.argv[1], retire=lambda: _remove_socket(sys.argv[1])))


def run_server(start: Callable[[], Callable[[], None] | None]) -> None:
    """Serve (`start`: `serve` with its arguments); in a forked child, run the proc; then exit."""
    run = start()
    if run is not None:
        run()
    # The server: nothing to tear down (it ran no code but imports); a teardown of the frozen heap would
    # print extension modules' "leaked" counts (triton's nanobind) and take a second.
    os._exit(0)


if __name__ == "__main__":
    main()
