"""A zygote: a warm interpreter that starts session servers by fork, so that a `forge_nb.up` after the first does not
pay the server's imports (torch, transformers, forge_nb's trainer: ~4.5 s of CPU here, most of a small session's
start).

    python -m forge_nb.server --zygote DIR      (started, detached, by the first `forge_nb.up` that finds none)

There is one per user and *start context*: what a server started afresh inherits from the process that starts it,
its interpreter, environment (but for the variables tools set per process: `PER_PROCESS`), namespaces, cgroup, CPU
affinity and limits (`context_key`). A client in another context (another venv, `CUDA_VISIBLE_DEVICES`, a Slurm job,
a network namespace) gets a zygote of its own. Its folder is ``<runtime>/.zygote-KEY/`` (0700; socket and key
0600), beside the sessions' (`server.registry`).

A client connects as a session's clients do: this user (the socket's peer credentials), holding the key (an HMAC
challenge each way). It sends the session's folder, its working directory, umask and environment (`Spawn`). The
zygote forks; the child leaves the zygote's session, takes on the client's directory, umask and environment, writes
to the session's server.log, and goes on as ``python -m forge_nb.server FOLDER`` does (`forge_nb.server.__main__`),
its imports done. The zygote answers with the child's pid; the child is the session's server from there on.

It refuses, and the client starts a server afresh as it did before (`start`):
- when the client's directory holds a module the zygote imported from elsewhere (a ``json.py`` there: a fresh
  ``python -m`` puts that directory first on sys.path);
- when a file of a module it imported changed since (forge_nb edited in place): it ends, and the next client starts a
  zygote that imports the new code.

It imports no Monarch (whose runtime's threads a fork cannot carry), serves one request at a time, and ends after
``FORGE_NB_ZYGOTE_IDLE_S`` seconds (default `IDLE_S`) without one, on SIGTERM, when its socket file goes, and with
``forge-nb down --all``. The servers it forked go on without it.

Who starts one: a Jupyter kernel's `up` (where sessions start again and again: restarts, other notebooks), or any
process with ``FORGE_NB_ZYGOTE=1``; a script's `up` uses one that runs but leaves none behind it.
``FORGE_NB_ZYGOTE=0``: no zygote; every server starts afresh.
"""

from __future__ import annotations

import ctypes
import hashlib
import os
import pickle
import resource
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
from contextlib import AbstractContextManager, suppress
from dataclasses import dataclass
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, Connection
from pathlib import Path

from forge_nb.private_files import write_private
from forge_nb.server.handshake import check_client, peer_uid, prove_to_server

ENV = "FORGE_NB_ZYGOTE"
IDLE_ENV = "FORGE_NB_ZYGOTE_IDLE_S"
IDLE_S = 600.0  # a zygote holds torch and transformers imported (~0.5 GB resident): gone after 10 idle minutes
READY_S = 120.0  # its imports, on loaded cores (a session's server gives its own as long: `start.SOCKET_WAIT_S`)
HANDSHAKE_S = 10.0
PREFIX = ".zygote-"  # not a session's name (a letter or digit first), so `registry.sessions` passes it by
SOCKET, KEY, PID, LOG, LOCK = "socket", "key", "pid", "zygote.log", "lock"
#: Environment variables that tools set per process and no import reads: a client's differ from the zygote's
#: starter's without changing what a fresh server would import (pytest's current test, a kernel's parent).
PER_PROCESS = ("PYTEST_", "JPY_")
PER_PROCESS_NAMES = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "COLUMNS", "LINES"})
#: A last argument of spaces: room for a forked server's own command line, longer by its session's name (`_retitle`).
PAD = " " * 64
_started: list[subprocess.Popen] = []  # zygotes this process started (polled, so none stays a zombie)


@dataclass
class Spawn:
    """What a client sends: the session's folder, and what the server would have inherited from the client."""

    folder: str
    cwd: str
    umask: int
    env: dict[str, str]


def wanted() -> bool:
    """Whether servers start from a zygote: on Linux (fork, peer credentials), unless ``FORGE_NB_ZYGOTE=0``."""
    return os.environ.get(ENV) != "0" and sys.platform == "linux"


def may_start() -> bool:
    """Whether this process starts a zygote when none runs: with ``FORGE_NB_ZYGOTE=1``, or unset in a Jupyter kernel
    (a script's would outlive it by `IDLE_S`, for no next session)."""
    return os.environ.get(ENV) == "1" or (ENV not in os.environ and "ipykernel" in sys.modules)


# ---- the client's side ----------------------------------------------------------------------------------------
def spawn(folder: Path) -> int | None:
    """A server for the session at `folder`, forked by this context's zygote (one is started if none runs and
    `may_start`) -> its pid; None when no zygote forked one (off, none running, refused, or failed: its log says
    why), and the caller starts one."""
    if not wanted():
        return None
    starts = may_start()
    home = _home(context_key(), make=starts)
    if home is None:
        return None  # none runs here, and this process starts none
    request = Spawn(str(folder), os.getcwd(), _umask(), dict(os.environ))
    try:
        conn = _connect(home) or (_start_and_connect(home) if starts else None)
        if conn is None:
            return None
        with conn:
            conn.send(request)
            if not conn.poll(READY_S):
                return None
            verdict, value = conn.recv()
    except (OSError, EOFError, AuthenticationError, pickle.PickleError, ValueError):
        return None  # it ended meanwhile (idle, or down --all): the caller starts the server itself
    return int(value) if verdict == "ok" else None


def context_key() -> str:
    """A digest of what a server started from this process inherits (see the module docstring)."""
    env = sorted((k, v) for k, v in os.environ.items() if not per_process(k))
    namespaces = []
    for ns in ("mnt", "net", "pid", "ipc", "uts", "user", "cgroup"):
        with suppress(OSError):
            namespaces.append(os.readlink(f"/proc/self/ns/{ns}"))
    try:
        cgroup = Path("/proc/self/cgroup").read_text()
    except OSError:
        cgroup = ""
    limits = [resource.getrlimit(r) for r in (resource.RLIMIT_NOFILE, resource.RLIMIT_AS, resource.RLIMIT_NPROC)]
    parts = (sys.executable, sys.version, os.getuid(), env, namespaces, cgroup, sorted(os.sched_getaffinity(0)),
             limits, os.getpriority(os.PRIO_PROCESS, 0))  # fmt: skip
    return hashlib.sha256(repr(parts).encode()).hexdigest()[:16]


def per_process(name: str) -> bool:
    return name in PER_PROCESS_NAMES or name.startswith(PER_PROCESS)


def _home(key: str, make: bool = True) -> Path | None:
    """The folder of the zygote of context `key` (made 0700 if `make`; None if it is not there and not `make`)."""
    from forge_nb.server.registry import private, runtime_dir

    home = runtime_dir() / f"{PREFIX}{key}"
    if not make and not home.is_dir():
        return None
    home.mkdir(mode=0o700, exist_ok=True)
    private(home)
    return home


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _connect(home: Path) -> Connection | None:
    """A connection to the zygote of `home`, the handshake done -> None if none runs there."""
    if running(home) is None:
        return None
    try:
        conn = Client(str(home / SOCKET), family="AF_UNIX")
        prove_to_server(conn, (home / KEY).read_bytes())
    except (OSError, EOFError, AuthenticationError):
        return None
    return conn


def _start_and_connect(home: Path) -> Connection | None:
    """Start the zygote of `home` (unless another client did meanwhile), wait until it listens, connect."""
    for zygote in _started[:]:
        if zygote.poll() is not None:
            _started.remove(zygote)
    with _locked(home):
        conn = _connect(home)
        if conn is not None:
            return conn
        _clear(home)
        write_private(home / KEY, os.urandom(32))
        with open(home / LOG, "ab") as log:
            zygote = subprocess.Popen(
                [sys.executable, "-m", "forge_nb.server", "--zygote", str(home), PAD],
                cwd=home,  # nothing to import there: its imports are the same whatever the client's folder
                env=dict(os.environ),  # what `context_key` read (not what a library set in C: Monarch's trace id)
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,  # not in the starting kernel's process group: a restart does not reach it
                close_fds=True,
            )
        _started.append(zygote)
        deadline = time.monotonic() + READY_S
        while running(home) != zygote.pid:
            if zygote.poll() is not None or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
    return _connect(home)


def _locked(home: Path) -> AbstractContextManager[None]:
    """One process at a time starts or clears the zygote of `home`."""
    from forge_nb.server.registry import locked

    return locked(home / LOCK)


def running(home: Path) -> int | None:
    """The pid of the zygote that serves `home`, once it listens (None: none does)."""
    from forge_nb.server.registry import same_process

    try:
        pid, started = (home / PID).read_text().split()
    except (OSError, ValueError):
        return None
    return int(pid) if same_process(int(pid), float(started)) else None


def _clear(home: Path) -> None:
    for name in (SOCKET, KEY, PID, LOG):
        (home / name).unlink(missing_ok=True)


def homes() -> list[Path]:
    """This user's zygote folders (of every context)."""
    from forge_nb.server.registry import runtime_dir

    return sorted(p for p in runtime_dir().iterdir() if p.name.startswith(PREFIX) and p.is_dir())


def pids() -> list[int]:
    """The pids of this user's running zygotes (a no-process-left check leaves them out: they outlive sessions)."""
    return [pid for home in homes() if (pid := running(home)) is not None]


def stop_all(timeout: float = 5.0) -> list[int]:
    """End every zygote of this user and clear their folders (`forge-nb down --all`) -> the pids ended. The servers
    they forked go on."""
    import psutil

    ended = []
    for home in homes():
        pid = running(home)
        if pid is not None:
            with suppress(psutil.Error):
                process = psutil.Process(pid)
                process.terminate()
                try:
                    process.wait(timeout)
                except psutil.TimeoutExpired:
                    process.kill()
                ended.append(pid)
        with _locked(home):
            if running(home) is None:
                _clear(home)
        shutil.rmtree(home, ignore_errors=True)
    return ended


# ---- the zygote's side ----------------------------------------------------------------------------------------
class Zygote:
    """The process of ``python -m forge_nb.server --zygote HOME`` (see the module docstring)."""

    def __init__(self, home: Path) -> None:
        self.home, self.pid = home, os.getpid()
        if context_key() != home.name.removeprefix(PREFIX):
            raise SystemExit(f"forge_nb zygote: {home} is not this process's context; not serving it")
        self.key = (home / KEY).read_bytes()
        self.idle_s = float(os.environ.get(IDLE_ENV) or IDLE_S)
        self.ending = False
        from forge_nb.launch.forks import early

        early.warm_up()  # what a server imports before its fork server forks (`launch.forks.early`)
        if "monarch" in sys.modules:
            raise SystemExit("forge_nb zygote: an import brought in Monarch, which a fork cannot carry; not serving")
        self.loaded = _loaded_files()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        (home / SOCKET).unlink(missing_ok=True)
        self.listener.bind(str(home / SOCKET))
        os.chmod(home / SOCKET, 0o600)
        self.socket_inode = os.stat(home / SOCKET).st_ino
        self.listener.listen(16)
        self.listener.settimeout(1.0)  # the idle timeout and SIGTERM are looked at each second
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, self._end)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        import psutil

        write_private(home / PID, f"{self.pid} {psutil.Process().create_time()}".encode())  # it listens: ready
        print(f"forge_nb zygote {self.pid}: ready ({len(self.loaded)} module files imported)", flush=True)

    def _socket_is_ours(self) -> bool:
        """Whether its socket file is still there and its own: a zygote whose folder went (the runtime folder
        removed) ends, found by no client."""
        try:
            return os.stat(self.home / SOCKET).st_ino == self.socket_inode
        except OSError:
            return False

    def _end(self, *_: object) -> None:
        self.ending = True

    def serve(self) -> str:
        """Fork a server for each request until idle or told to end -> in a forked child, its session's folder
        (it goes on as the server); the zygote itself exits here."""
        last = time.monotonic()
        try:
            while not self.ending and time.monotonic() - last < self.idle_s and self._socket_is_ours():
                _reap()
                try:
                    sock, _ = self.listener.accept()
                except (TimeoutError, InterruptedError):
                    continue
                folder = self._request(Connection(sock.detach()))
                if folder is not None:
                    return folder  # (the child)
                last = time.monotonic()
        finally:
            if os.getpid() == self.pid:
                self._close()
        why = (
            "told to end"
            if self.ending
            else "its socket went"
            if not self._socket_is_ours()
            else f"idle for {self.idle_s:g} s"
        )
        print(f"forge_nb zygote {self.pid}: {why}; ending", flush=True)
        raise SystemExit(0)

    def _request(self, conn: Connection) -> str | None:
        """One client: the handshake, its `Spawn`, the fork -> the folder in the child, None here."""
        try:
            if peer_uid(conn) != os.getuid():
                print("forge_nb zygote: refused a connection from another user", flush=True)
                return None
            request = check_client(conn, self.key, time.monotonic() + HANDSHAKE_S).recv()
            if not isinstance(request, Spawn):
                return None
            why = self._refusal(request)
            if why is not None:
                print(f"forge_nb zygote {self.pid}: not forking a server for {request.folder}: {why}", flush=True)
                conn.send(("no", why))
                return None
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                try:
                    return self._become_server(request, conn)
                except BaseException:  # never back into the zygote's loop: a second zygote would serve
                    traceback.print_exc()
                    os._exit(1)
            conn.send(("ok", pid))
            print(f"forge_nb zygote {self.pid}: forked server {pid} for {request.folder}", flush=True)
        except (OSError, EOFError, TimeoutError, AuthenticationError, pickle.PickleError, AttributeError, ImportError):
            print(f"forge_nb zygote {self.pid}: a request failed:\n{traceback.format_exc()}", flush=True)
        finally:
            if os.getpid() == self.pid:
                conn.close()
        return None

    def _refusal(self, request: Spawn) -> str | None:
        """Why a server forked from here would not be what ``python -m forge_nb.server`` started by the client is
        -> None: it would be."""
        changed = [f for f, mtime in self.loaded.items() if _mtime(f) != mtime]
        if changed:
            self.ending = True  # the next client starts a zygote that imports the code as it is now
            return f"{len(changed)} imported file(s) changed since it started, e.g. {changed[0]}"
        shadowed = _shadowed(request.cwd)
        if shadowed:
            return f"{request.cwd} holds {', '.join(shadowed)}, which a fresh server would import from there"
        return None

    def _become_server(self, request: Spawn, conn: Connection) -> str:
        """In the forked child: take on what the client's fresh server would have had -> the session's folder."""
        conn.close()
        self.listener.close()  # (the zygote's socket file stays: closing a descriptor does not unlink it)
        os.setsid()
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(signum, signal.SIG_DFL)
        os.chdir(request.cwd)
        os.umask(request.umask)
        os.environ.clear()
        os.environ.update(request.env)
        sys.path[0] = request.cwd  # where ``python -m`` puts the working directory
        log = os.open(Path(request.folder) / "server.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        null = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null, 0), (log, 1), (log, 2)):
            os.dup2(fd, target)
        os.close(log)
        os.close(null)
        _retitle([sys.executable, "-m", "forge_nb.server", request.folder])  # as one started afresh reads in ps
        numpy = sys.modules.get("numpy")
        if numpy is not None:  # its global generator, seeded once in the zygote (Python's `random` reseeds itself)
            numpy.random.seed()
        return request.folder

    def _close(self) -> None:
        self.listener.close()
        with suppress(OSError), _locked(self.home):  # (OSError: the folder went)
            if running(self.home) == self.pid:
                _clear(self.home)


def _loaded_files() -> dict[str, float]:
    """Each imported module's file -> its modification time."""
    files = {}
    for module in list(sys.modules.values()):
        path = getattr(module, "__file__", None)
        if path and (mtime := _mtime(path)) is not None:
            files[path] = mtime
    return files


def _mtime(path: str) -> float | None:
    try:
        return os.stat(path).st_mtime
    except OSError:
        return None


def _shadowed(cwd: str) -> list[str]:
    """The top-level modules imported here that a fresh ``python -m`` in `cwd` would import from `cwd` instead."""
    try:
        entries = set(os.listdir(cwd))
    except OSError:
        return []
    found = []
    for name, module in list(sys.modules.items()):
        if "." in name or (name not in entries and f"{name}.py" not in entries and not _extension_in(name, entries)):
            continue
        there = _module_file(Path(cwd), name, entries)
        here = getattr(module, "__file__", None)
        if there is not None and (here is None or os.path.realpath(here) != os.path.realpath(there)):
            found.append(name)
    return sorted(found)


def _extension_in(name: str, entries: set[str]) -> bool:
    return any(e.startswith(f"{name}.") and e.endswith(".so") for e in entries)


def _module_file(cwd: Path, name: str, entries: set[str]) -> str | None:
    """The file `name` is imported from when `cwd` comes first on sys.path (None: a namespace folder at most,
    which a package found further on wins over)."""
    if name in entries and (cwd / name / "__init__.py").is_file():
        return str(cwd / name / "__init__.py")
    for entry in sorted(entries):
        if entry == f"{name}.py" or (entry.startswith(f"{name}.") and entry.endswith(".so")):
            return str(cwd / entry)
    return None


def _retitle(argv: list[str]) -> bool:
    """Make this process's command line read `argv` (what ps, top and psutil show), in the space the zygote's own
    took (`PAD` keeps room) -> whether it fit. setproctitle's way: the arguments' memory rewritten, its last byte
    not NUL, so that Linux reads the line up to its first NUL."""
    try:
        fields = Path("/proc/self/stat").read_text().rsplit(")", 1)[1].split()
        start, end = int(fields[45]), int(fields[46])  # arg_start and arg_end: fields 48 and 49 of proc(5)
    except (OSError, ValueError, IndexError):
        return False
    line = " ".join(argv).encode() + b"\0"
    if len(line) > end - start:
        return False
    ctypes.memmove(start, line.ljust(end - start, b" "), end - start)
    return True


def _reap() -> None:
    """Collect the servers that ended (they are this process's children until it ends)."""
    with suppress(ChildProcessError):
        while os.waitpid(-1, os.WNOHANG)[0]:
            pass


def serve_here(home: str) -> str:
    """``python -m forge_nb.server --zygote HOME``: serve until idle (then exit) -> in a forked child, the folder of
    the session it is the server of."""
    return Zygote(Path(home)).serve()
