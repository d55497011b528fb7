"""A session's server: the process that owns one `Session` (its Monarch controller, its actors, background runs,
run directory, rollout log and metrics), so that the session outlives the kernels and scripts that use it.

    python -m forge_nb.server DIR      (started by `forge_nb.up`, detached: its own session and process group)

It reads what to start from DIR/request.pkl (written 0600 by the client, removed once read), listens on DIR/socket
(0600, in a 0700 folder), and serves each client connection in a thread: a connection proves it holds the
session's key (HMAC challenge, `multiprocessing.connection`) and comes from this user (the socket's peer
credentials) before anything it sends is read. A connection that stalls in the handshake is dropped after
`HANDSHAKE_S`; one that sends something malformed, or goes away mid-call, is closed, and the session goes on.
Each refusal is counted (`runtime.refusals`) and said in the session's events, at most once a second.

It ends on a client's `down`, on SIGTERM or SIGINT, or when no client has been attached, no background run has
been running and no Tinker client has been at work for `session.idle_timeout_s`; its procs go with it
(`Session.down`). Killed outright, its procs are taken down by Monarch as the controller's connection to them drops,
and its folder stays for `forge-nb ps` to report it gone, with its last checkpoint.
"""

from __future__ import annotations

import os
import pickle
import signal
import socket
import sys
import threading
import time
import traceback
from multiprocessing import AuthenticationError
from multiprocessing.connection import Connection, Listener
from pathlib import Path
from typing import Any

import psutil

from forge_nb.errors import SessionDown
from forge_nb.launch.forks import early
from forge_nb.runtime.refusals import REFUSED, raise_open_files_limit
from forge_nb.server.handshake import check_client, peer_uid
from forge_nb.server.protocol import REQUEST, Failure, Hello, StartRequest
from forge_nb.server.registry import SessionDir, SessionInfo
from forge_nb.server.service import Busy

HANDSHAKE_S = 30.0  # a connection that has not proven the key by then is dropped
DOWN_WAITS_S = 120.0  # `down` waits this long at most for another client's command in flight (a save) to end
HEARTBEAT_S = 2.0  # how often info.json is brought up to date (and what the listeners refused is said)
LISTENER = "session socket"


class SessionServer:
    """Serves the session of `folder` (see the module docstring)."""

    def __init__(self, folder: SessionDir) -> None:
        self.folder = folder
        request_path = folder.path / REQUEST
        self.request: StartRequest = pickle.loads(request_path.read_bytes())
        request_path.unlink()
        self.key = folder.key()
        config = self.request.config
        self.idle_timeout_s = config.session.idle_timeout_s
        me = psutil.Process()
        self.info = SessionInfo(
            folder.name, me.pid, socket.gethostname(), time.time(), idle_timeout_s=self.idle_timeout_s,
            pid_started=me.create_time(),
        )  # fmt: skip
        self.service: Any = None  # the `SessionService`, once the session is up (None again once it goes down)
        self.run_dir: Path | None = None  # where the log goes at the end (the session's run directory)
        self.start_error: Failure | None = None
        self.error_told = False  # a client received the start's error (then the folder need not keep it)
        self.up = threading.Event()  # set once the session is up, or failed to come up
        self.ending = threading.Event()
        self.clients: dict[int, Hello] = {}  # connection id -> who
        self.calls_in_flight = 0
        self.idle_since = time.monotonic()
        self._lock = threading.Lock()
        self.listener = Listener(str(folder.socket), family="AF_UNIX")
        os.chmod(folder.socket, 0o600)
        folder.write_info(self.info)

    # -- the process --------------------------------------------------------------------------------------------
    def serve(self) -> int:
        """Start the session, serve clients until the session ends -> exit status."""
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: self.ending.set())
        signal.signal(signal.SIGHUP, signal.SIG_IGN)
        threading.Thread(target=self._accept, name="forge_nb-server-accept", daemon=True).start()
        if not self._start():
            self.ending.wait(30.0)  # the client that started it reads the error, then the server goes
            self._close(failed=True)
            return 1
        while not self.ending.wait(HEARTBEAT_S):
            try:
                self._heartbeat()
            except Exception:  # a status that could not be read this time: the next beat tries again
                traceback.print_exc()
            if self._idle_for() > self.idle_timeout_s > 0:
                print(f"forge_nb server: no client and nothing running for {self.idle_timeout_s:g} s; ending")
                break
            if not self._owner_alive():
                print(f"forge_nb server: the process that started the session ({self.request.owner[0]}) ended; ending")
                break
        self._down()
        self._close(failed=False)
        return 0

    def _start(self) -> bool:
        from forge_nb.server.service import SessionService
        from forge_nb.session import Session

        r = self.request
        try:
            if r.resume_from is not None:
                session = Session.restore(r.resume_from, **(r.overrides or {}))
            else:
                session = Session.up(r.config, **({"task": r.data} if r.data is not None else {}))
        except BaseException as e:
            traceback.print_exc()
            self.start_error = Failure.of(e)
            self.info.state, self.info.error = "failed", f"{type(e).__name__}: {e}"
            self.folder.write_info(self.info)
            self.up.set()
            return False
        early.drop_unused()  # the fork server forked before Monarch (`python -m forge_nb.server`), if no mesh took it
        self.service = SessionService(session, self.folder.name)
        self.service.clients = self._client_names
        self.idle_timeout_s = self.info.idle_timeout_s = session.config.session.idle_timeout_s  # (a resume's own)
        self.info.state = "up"
        self._heartbeat()
        self.up.set()
        print(f"forge_nb server: session {self.folder.name!r} up (run directory {session.run_dir})", flush=True)
        return True

    def _take_service(self) -> Any:
        """The service, taken out under the lock, its info saying "down" before the session is touched: from
        here every call is answered with SessionDown and no one attaches to a session going down."""
        with self._lock:
            service, self.service = self.service, None
        if service is not None:
            self.run_dir = Path(service.session.run_dir)
            self.info.state = "down"
            self.folder.write_info(self.info)
        return service

    def _down(self) -> None:
        service = self._take_service()
        if service is None:
            return
        try:
            service.session.down()
        except Exception:
            traceback.print_exc()

    def _close(self, failed: bool) -> None:
        """Stop listening; the folder goes (with the log kept in the run directory), unless the start failed
        and no client heard why: then its info says why until `forge-nb down` clears it."""
        try:
            self.listener.close()
        except OSError:
            pass
        if failed and not self.error_told:
            return
        sys.stdout.flush()
        self.folder.remove(keep_log_in=self.run_dir)

    def _heartbeat(self) -> None:
        service = self.service
        if service is not None:
            s = service.session
            s.note_refusals()  # what this process's listeners refused: a "security" event
            status = s.status()
            run = s.background
            self.info.model = str(status.get("model", ""))
            self.info.task = str(s.config.task.name)
            self.info.mesh = str(status.get("mesh", ""))
            self.info.engine = str(status.get("engine", ""))
            self.info.procs = sum(len(p) for p in status.get("procs", {}).values())
            self.info.step = s.step_count
            self.info.policy_version, self.info.generator_version = s.trainer_version, s.generator_version
            self.info.reward_version = status.get("reward_version", 0)
            self.info.loss_version = status.get("loss_version", 0)
            self.info.run = None if run is None else run.state
            self.info.run_dir = str(s.run_dir)
            self.info.last_checkpoint = service.last_checkpoint()
        self.info.clients = self._client_names()
        self.folder.write_info(self.info)

    def _owner_alive(self) -> bool:
        """Whether the process this session goes with (a script's, `StartRequest.owner`) still runs."""
        if self.request.owner is None:
            return True
        pid, started = self.request.owner
        try:
            return abs(psutil.Process(pid).create_time() - started) < 1.0 and psutil.pid_exists(pid)
        except psutil.Error:
            return False

    def _client_names(self) -> list[str]:
        with self._lock:
            return sorted({hello.who for hello in self.clients.values()})

    def _idle_for(self) -> float:
        """Seconds with no client attached, no call in flight, no background run running and no Tinker client at work
        (0: not idle)."""
        with self._lock:
            if self.clients or self.calls_in_flight:
                self.idle_since = time.monotonic()
                return 0.0
        run = self.service.session.background if self.service is not None else None
        tinker = self.service.session.tinker if self.service is not None else None
        if (run is not None and run.state == "running") or (tinker is not None and tinker.service.busy()):
            self.idle_since = time.monotonic()
            return 0.0
        return time.monotonic() - self.idle_since

    # -- connections --------------------------------------------------------------------------------------------
    def _accept(self) -> None:
        while not self.ending.is_set():
            try:
                conn = self.listener.accept()
            except OSError:
                return  # closed
            threading.Thread(target=self._connection, args=(conn,), name="forge_nb-server-client", daemon=True).start()

    def _connection(self, conn: Connection) -> None:
        """One client's connection: the handshake, then its calls until it closes."""
        cid = id(conn)
        try:
            hello = self._handshake(conn)
            if hello is None:
                return
            with self._lock:
                self.clients[cid] = hello
            while not self.ending.is_set():
                message = conn.recv()
                if not (isinstance(message, tuple) and len(message) == 5 and message[0] == "call"):
                    REFUSED.refused(LISTENER, "a malformed message", hello.who)
                    return
                conn.send(self._answer(hello, *message[1:]))
        except (pickle.UnpicklingError, AttributeError, ImportError, TypeError):
            REFUSED.refused(LISTENER, "a message that cannot be read")  # its connection ends, the session goes on
        except (EOFError, OSError):
            pass  # the client went away
        finally:
            with self._lock:
                self.clients.pop(cid, None)
            conn.close()

    def _handshake(self, conn: Connection) -> Hello | None:
        """The peer is this user and proves the key; then it says who it is, all within `HANDSHAKE_S`. None (and
        closed by the caller): it did not."""
        uid = peer_uid(conn)
        if uid != os.getuid():
            REFUSED.refused(LISTENER, "another user", f"uid {uid}")
            return None
        deadline = time.monotonic() + HANDSHAKE_S
        try:
            conn = check_client(conn, self.key, deadline)  # each read waits until the deadline at most
            hello = conn.recv()
        except AuthenticationError:
            REFUSED.refused(LISTENER, "no key")
            return None
        except TimeoutError:
            REFUSED.refused(LISTENER, "handshake not finished")
            return None
        except Exception:
            REFUSED.refused(LISTENER, "closed in its handshake")
            return None
        if not isinstance(hello, Hello):
            REFUSED.refused(LISTENER, "not a client")
            return None
        return hello

    def _answer(self, hello: Hello, method: Any, args: Any, kwargs: Any, wait: Any) -> tuple:
        """The reply to one call: ("ok", value), ("busy", holder) or ("error", Failure)."""
        with self._lock:
            self.calls_in_flight += 1
        try:
            if method == "wait_up":
                return ("ok", self._wait_up(args[0] if args else None))
            if method == "down":
                return ("ok", self._client_down(hello))
            if self.service is None:  # going down (`_client_down`): the server answers until it ends
                raise SessionDown("forge_nb: the session is not up")
            if not (isinstance(method, str) and isinstance(args, tuple) and isinstance(kwargs, dict)):
                raise TypeError("forge_nb: a call is (method name, args tuple, kwargs dict)")
            value = self.service.call(hello.who, method, args, kwargs, bool(wait))
            pickle.dumps(value)  # what cannot cross is an error here, not a dead connection
            return ("ok", value)
        except Busy as busy:
            return ("busy", busy.holder)
        except BaseException as e:
            return ("error", Failure.of(e))
        finally:
            with self._lock:
                self.calls_in_flight -= 1
                self.idle_since = time.monotonic()

    def _wait_up(self, timeout: float | None) -> dict[str, Any]:
        """Block until the session is up -> its status; its start's error if it failed."""
        if not self.up.wait(timeout):
            raise TimeoutError(f"forge_nb: the session did not come up within {timeout} s")
        if self.start_error is not None:
            self.error_told = True
            self.ending.set()
            raise self.start_error.exception()
        return self.service.remote_status("")

    def _client_down(self, hello: Hello) -> bool:
        """`down` from a client: the session and every proc stopped before this returns (an error stopping them
        reaches the client); then the server ends, either way."""
        print(f"forge_nb server: down, asked by {hello.who}", flush=True)
        try:
            service = self._take_service()
            if service is not None:
                service.finish_commands(DOWN_WAITS_S)  # another client's save ends whole; its step(n) stops
                service.session.down()
        finally:
            self.ending.set()
        return True


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        print("usage: python -m forge_nb.server SESSION_DIR (started by forge_nb.up)", file=sys.stderr)
        return 2
    raise_open_files_limit()  # its listeners (its socket, a hosts session's Monarch port) outlast a flood longer
    return SessionServer(SessionDir(Path(args[0]))).serve()
