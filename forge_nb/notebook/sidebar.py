"""The kernel side of the JupyterLab forge sidebar (`extensions/jupyterlab-forge`): the comm target
``forge_nb.sidebar``, registered by ``%load_ext forge_nb`` (or by the sidebar's probe, below).

The sidebar talks to the kernel only over the kernel channel that Jupyter already authenticates
(comm messages and one silent execute request): no server endpoint.

Protocol 2. Every message is a JSON object with a ``type``.

frontend -> kernel
    comm_open with data ``{"protocol": 2}``
        answered at once with a ``state``; after that the kernel pushes a ``state`` whenever what it
        shows has changed, at most ``MAX_HZ`` (2) per second: metrics rows are batched, never one
        message per row.
    ``{"type": "refresh"}``
        a ``state`` now (the frontend asks after its websocket reconnects).
    ``{"type": "action", "id": int, "action": "sync" | "run" | "pause" | "resume" | "attach"}``
        ``Session.sync()`` / ``run()`` / ``pause()`` / ``resume()`` in a worker thread (the comm
        handler never waits on the mesh), or ``forge_nb.attach(name)`` of the ``attachable`` session;
        a ``result`` with the same ``id`` follows, then a ``state``.

kernel -> frontend
    ``{"type": "state", "protocol": 2, "time": float, "session": SESSION | null, "attachable": ATTACHABLE | null}``
        ``time``: unix seconds when taken. ``session`` is null when no session is up in this kernel; then
        ``attachable`` is this notebook's session when its server still runs it (after a kernel restart):
        ``{"name": str, "steps": int, "run": str | null}``.
    ``{"type": "result", "id": int, "action": str, "ok": bool, "message": str}``
        ``message``: one line for the sidebar ("policy v4 served in 210 ms (1.30 GB/s)", or
        "RunError: ...").

SESSION, from ``Session.status()`` (and the metrics stream for tokens/s)::

    "name": str                       the session's name (`forge-nb ps`), "clients": int (attached now)
    "mesh": "local" | "slurm", "slurm_job": str | null, "engine": "vllm" | "torch"
    "actors": [{"role": str, "pids": [int], "health": HEALTH, "devices": [[int]], "hosts": [str]}]
                                      one entry per role; devices and hosts: the placement plan's,
                                      one entry per proc (devices [] on the CPU)
    "steps": int                      trained batches
    "samples": int                    samples added to the replay buffer
    "policy": {"trainer": int, "generator": int, "staleness": int}
                                      policy versions; staleness = trainer - generator (versions)
    "reward_version": int, "loss_version": int
    "run": null | {"state": "running" | "paused" | "finished" | "failed", "steps_done": int,
                   "error": str | null}       (the error's first line only)
    "tokens_per_s": {"last": float | null, "history": [float]}
                                      generated tokens per second of generation, one value per trained
                                      step, the last ``HISTORY`` (60), oldest first

HEALTH: "alive" (every proc of the role runs), "degraded" (some do not), "dead" (none does), or
"remote" (a Slurm mesh: its procs run on other hosts and are not checked from the kernel's host).

The probe: a kernel that imported forge_nb without ``%load_ext`` (``forge_nb.up()`` in a cell), or a new
kernel of a notebook whose session still runs, has no target yet. The sidebar then sends one silent execute
request whose user expression is ``PROBE``: it calls ``probe()`` when forge_nb is installed in the kernel's
environment (importing this module: no torch, no Monarch), and the sidebar opens the comm when the answer is
``"ready"``.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import psutil

from forge_nb.runtime import lifecycle

TARGET = "forge_nb.sidebar"
PROTOCOL = 2
MAX_HZ = 2.0  # state messages per second, at most
HISTORY = 60  # tokens/s points in the sparkline (trained steps)
# A reloaded browser tab never closes its comm: past this many, the oldest is closed, so dead comms
# do not pile up (and keep the ticker running) in a long-lived kernel.
MAX_COMMS = 8
ACTIONS = ("sync", "run", "pause", "resume", "attach")
# The sidebar's user expression (kept here so the protocol lives in one place; the TypeScript copies it).
PROBE = (
    "__import__('forge_nb.notebook.sidebar', fromlist=['probe']).probe() "
    "if __import__('importlib.util', fromlist=['find_spec']).find_spec('forge_nb') else 'absent'"
)

Message = dict[str, Any]


def first_line(text: str | None) -> str | None:
    """The first non-empty line of `text` (errors carry tracebacks; the sidebar shows one line)."""
    if not text:
        return None
    return next((line.strip() for line in text.splitlines() if line.strip()), None)


def health(pids: Sequence[int], local: bool, alive: Callable[[int], bool]) -> str:
    """HEALTH of one role's procs (see the module docstring)."""
    if not local:
        return "remote"
    up = sum(1 for pid in pids if alive(pid))
    return "alive" if pids and up == len(pids) else "dead" if up == 0 else "degraded"


def pid_alive(pid: int) -> bool:
    """Whether `pid` runs on this host (a zombie does not: its proc has exited)."""
    try:
        return psutil.Process(pid).status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def snapshot(
    status: dict[str, Any], history: Iterable[float], alive: Callable[[int], bool] = pid_alive
) -> Message | None:
    """SESSION (module docstring) from `Session.status()` and the tokens/s of recent steps, or None
    when the session is down."""
    if not status.get("up"):
        return None
    local = status.get("mesh") == "local"
    policy = status["policy_version"]
    run = status.get("run")
    points = [round(float(v), 1) for v in history]
    return {
        "name": status.get("session", ""),
        "clients": len(status.get("clients", [])),
        "mesh": status.get("mesh"),
        "slurm_job": status.get("slurm_job"),
        "engine": status.get("engine"),
        "actors": [
            {"role": role, "pids": list(pids), "health": health(pids, local, alive), **placed(status, role, len(pids))}
            for role, pids in status.get("procs", {}).items()
        ],
        "steps": status.get("steps", 0),
        "samples": status.get("samples", 0),
        "policy": {
            "trainer": policy["trainer"],
            "generator": policy["generator"],
            "staleness": policy["trainer"] - policy["generator"],
        },
        "reward_version": status.get("reward_version"),
        "loss_version": status.get("loss_version"),
        "run": None
        if run is None
        else {"state": run["state"], "steps_done": run["steps_done"], "error": first_line(run.get("error"))},
        "tokens_per_s": {"last": points[-1] if points else None, "history": points},
    }


def placed(status: dict[str, Any], role: str, procs: int) -> dict[str, list]:
    """{"devices": GPUs of each of `role`'s procs, "hosts": their hosts} from the status's placement rows
    (a role the plan does not list, such as a judge: the CPU, host unknown)."""
    rows = [r for r in status.get("placement", []) if r["role"] == role]
    if len(rows) != procs:
        return {"devices": [[] for _ in range(procs)], "hosts": ["" for _ in range(procs)]}
    return {"devices": [list(r["devices"]) for r in rows], "hosts": [r["host"] for r in rows]}


def action_message(action: str, result: Any) -> str:
    """One line saying what an action did (`result`: what the Session call returned)."""
    if action == "sync" and isinstance(result, dict):
        if result.get("skipped"):
            return f"policy v{result.get('version')} was already served"
        seconds = result.get("total_seconds", result.get("seconds", 0.0))
        took = f"{seconds * 1000:.0f} ms" if seconds < 1 else f"{seconds:.1f} s"
        gbps = result.get("gbps")
        rate = f" ({gbps:.2f} GB/s)" if isinstance(gbps, int | float) and gbps > 0 else ""
        return f"policy v{result.get('version')} served in {took}{rate}"
    if action == "attach":
        return f"attached to session {result.name!r} (step {result.step_count})"
    return {"run": "background run started", "pause": "pausing after the step in flight", "resume": "resumed"}[action]


class Hub:
    """Every open sidebar comm of this kernel, and the ticker thread that feeds them.

    `current` returns the session to show (the one started last in this kernel); `max_hz` caps the
    state messages per second; `alive(pid)` checks a local proc.
    """

    def __init__(
        self,
        current: Callable[[], Any] = lifecycle.current,
        max_hz: float = MAX_HZ,
        alive: Callable[[int], bool] = pid_alive,
    ) -> None:
        self._current = current
        self._period = 1.0 / max_hz
        self._alive = alive
        self._comms: list[Any] = []
        self._lock = threading.Lock()
        self._session: Any = None
        self._unsubscribe: Callable[[], None] | None = None
        self._history: deque[float] = deque(maxlen=HISTORY)
        self._last: Message | None = None  # the state last broadcast, without its time
        self._wake = threading.Event()
        self._ticker: threading.Thread | None = None
        # One action at a time, off the kernel's comm handler: a second click waits for the first.
        self._actions = ThreadPoolExecutor(max_workers=1, thread_name_prefix="forge_nb-sidebar")

    # -- comms -------------------------------------------------------------------------------------
    def open(self, comm: Any, msg: Message) -> None:
        """The comm target: keep `comm`, answer with a state, start the ticker if it is not running."""
        comm.on_msg(lambda m: self._on_msg(comm, m))
        comm.on_close(lambda m: self._on_close(comm))
        with self._lock:
            self._comms.append(comm)
            stale, self._comms = self._comms[:-MAX_COMMS], self._comms[-MAX_COMMS:]
        for old in stale:
            _quietly(old.close)
        comm.send(self.state())
        with self._lock:
            if self._ticker is None:
                self._ticker = threading.Thread(target=self._tick, name="forge_nb-sidebar-ticker", daemon=True)
                self._ticker.start()

    def _on_close(self, comm: Any) -> None:
        with self._lock:
            if comm in self._comms:
                self._comms.remove(comm)
        self._wake.set()  # the ticker notices it has no comm left and ends

    def _on_msg(self, comm: Any, msg: Message) -> None:
        data = msg.get("content", {}).get("data", {}) or {}
        kind = data.get("type")
        if kind == "refresh":
            comm.send(self.state())
        elif kind == "action":
            self._actions.submit(self._act, comm, data.get("id"), data.get("action"))

    def _act(self, comm: Any, action_id: Any, action: Any) -> None:
        reply = {"type": "result", "id": action_id, "action": action}
        session = self._current()
        try:
            if action not in ACTIONS:
                raise ValueError(f"unknown action {action!r}; one of {', '.join(ACTIONS)}")
            if action == "attach":
                result = self._attach()
            elif session is None:
                raise RuntimeError("no session is up in this kernel")
            else:
                result = getattr(session, action)()
            reply |= {"ok": True, "message": action_message(action, result)}
        except Exception as e:  # shown in the sidebar: the click must say why it did nothing
            reply |= {"ok": False, "message": f"{type(e).__name__}: {first_line(str(e)) or ''}".rstrip(": ")}
        _send(comm, reply)
        self._wake.set()  # the new versions go out now, not at the next tick

    # -- state -------------------------------------------------------------------------------------
    def state(self) -> Message:
        """A ``state`` message for the current session (see the module docstring)."""
        session = self._bind(self._current())
        body = None
        if session is not None:
            with self._lock:
                history = list(self._history)
            try:
                status = session.status()
            except Exception:  # it went down while we read it: the next state says so
                status = {"up": False}
            body = snapshot(status, history, self._alive)
        attachable = self._attachable() if body is None else None
        return {"type": "state", "protocol": PROTOCOL, "time": time.time(), "session": body, "attachable": attachable}

    def _attachable(self) -> dict[str, Any] | None:
        """This notebook's session, when its server runs it and this kernel holds no session."""
        from forge_nb.server import registry, start

        name = start.notebook_name()
        if name is None:
            return None
        try:
            info = registry.SessionDir.named(name).info()
        except registry.RegistryError:
            return None
        if info is None or info.state != "up" or not info.alive:
            return None
        return {"name": name, "steps": info.step, "run": info.run}

    def _attach(self) -> Any:
        """The attach action: `forge_nb.attach` of this notebook's running session."""
        import forge_nb

        found = self._attachable()
        if found is None:
            raise RuntimeError("this notebook has no running session to attach to")
        return forge_nb.attach(found["name"])

    def _bind(self, session: Any) -> Any:
        """Follow the session started last: subscribe to its metrics, drop the previous one's."""
        with self._lock:
            if session is self._session:
                return session
            if self._unsubscribe is not None:
                _quietly(self._unsubscribe)
            self._session, self._unsubscribe = session, None
            self._history.clear()
            if session is None:
                return None
            # Subscribe before reading the rows so far: a row in between is at worst counted twice.
            self._unsubscribe = session.metrics_stream.subscribe(self._on_row)
            self._history.extend(r["tokens_per_s"] for r in session.metrics_stream.rows("step"))
            return session

    def _on_row(self, row: dict[str, Any]) -> None:
        """A metrics row (any thread): only queued here; the ticker sends at most MAX_HZ states."""
        if row.get("kind") == "step" and "tokens_per_s" in row:
            with self._lock:
                self._history.append(row["tokens_per_s"])

    def _tick(self) -> None:
        """Every period (or sooner after an action): one state to every comm, if it changed; never
        more than MAX_HZ states per second, early wake-ups included."""
        sent = 0.0  # time.monotonic() of the last broadcast
        while True:
            self._wake.wait(self._period)
            self._wake.clear()
            time.sleep(max(0.0, sent + self._period - time.monotonic()))
            with self._lock:
                comms = list(self._comms)
                if not comms:  # decided under the lock that `open` takes to start a ticker
                    self._ticker = None
            if not comms:
                self._bind(None)
                return
            state = self.state()
            body = {k: v for k, v in state.items() if k != "time"}
            if body != self._last:
                self._last, sent = body, time.monotonic()
                for comm in comms:
                    _send(comm, state)

    def close(self) -> None:
        """Close every comm and stop the ticker (tests; a kernel's exit stops the daemon threads)."""
        with self._lock:
            comms, self._comms = list(self._comms), []
        for comm in comms:
            _quietly(comm.close)
        ticker, self._ticker = self._ticker, None
        self._wake.set()
        if ticker is not None:
            ticker.join(timeout=5)
        self._actions.shutdown(wait=True)


def _send(comm: Any, data: Message) -> None:
    """Send, ignoring a comm the frontend closed meanwhile."""
    try:
        comm.send(data)
    except Exception:
        pass


def _quietly(fn: Callable[[], Any]) -> None:
    try:
        fn()
    except Exception:
        pass


_hub: Hub | None = None


def register(ipython: Any = None) -> bool:
    """Register the comm target in this kernel, once -> whether there is a kernel (a terminal IPython
    has none, and nothing to show a sidebar in)."""
    global _hub
    if ipython is None:
        from IPython import get_ipython

        ipython = get_ipython()
    manager = getattr(getattr(ipython, "kernel", None), "comm_manager", None)
    if manager is None:
        return False
    if _hub is None:
        _hub = Hub()
        manager.register_target(TARGET, _hub.open)
    return True


def probe() -> str:
    """The sidebar's user expression: register the target -> "ready" (or "no-kernel")."""
    return "ready" if register() else "no-kernel"
