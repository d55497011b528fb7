"""The kernel side of the JupyterLab sidebar (forge_nb.notebook.sidebar) without a kernel or a mesh: the
snapshot of a status, health, action messages, and the Hub with fake comms and a fake session
(throttled states, actions off the comm handler, following the current session)."""

from __future__ import annotations

import os
import threading
import time
from typing import Any

import pytest

from forge_nb.metrics import MetricsStream
from forge_nb.notebook import sidebar

STATUS = {
    "up": True,
    "mesh": "local",
    "slurm_job": None,
    "procs": {"generator": [101], "trainer": [102], "reward": [103, 104]},
    "engine": "torch",
    "weights_transport": "shm",
    "steps": 3,
    "policy_version": {"trainer": 4, "generator": 3},
    "samples": 48,
    "reward_version": 1,
    "loss_version": 0,
    "run": {
        "state": "failed",
        "steps_done": 2,
        "error": "loop: RuntimeError: boom\nTraceback (most recent call last):",
    },
    "reward_errors": 0,
    "last_reward_errors": [],
    "model": "/x",
    "placement": [
        {"role": "generator", "proc": 0, "host": "localhost", "devices": [2], "pid": 101},
        {"role": "trainer", "proc": 0, "host": "localhost", "devices": [0], "pid": 102},
        {"role": "reward", "proc": 0, "host": "localhost", "devices": [], "pid": 103},
        {"role": "reward", "proc": 1, "host": "localhost", "devices": [], "pid": 104},
    ],
}


def test_snapshot_of_a_status():
    snap = sidebar.snapshot(STATUS, [100.0, 200.04], alive=lambda pid: pid != 104)
    assert snap["policy"] == {"trainer": 4, "generator": 3, "staleness": 1}
    here = "localhost"
    assert snap["actors"] == [
        {"role": "generator", "pids": [101], "health": "alive", "devices": [[2]], "hosts": [here]},
        {"role": "trainer", "pids": [102], "health": "alive", "devices": [[0]], "hosts": [here]},
        {"role": "reward", "pids": [103, 104], "health": "degraded", "devices": [[], []], "hosts": [here, here]},
    ]
    assert snap["run"] == {"state": "failed", "steps_done": 2, "error": "loop: RuntimeError: boom"}
    assert snap["tokens_per_s"] == {"last": 200.0, "history": [100.0, 200.0]}
    assert (snap["steps"], snap["samples"], snap["reward_version"], snap["loss_version"]) == (3, 48, 1, 0)
    assert sidebar.snapshot({"up": False, "steps": 3}, []) is None
    assert sidebar.snapshot({**STATUS, "run": None}, [])["tokens_per_s"] == {"last": None, "history": []}


def test_health():
    assert sidebar.health([1, 2], local=True, alive=lambda pid: True) == "alive"
    assert sidebar.health([1, 2], local=True, alive=lambda pid: pid == 1) == "degraded"
    assert sidebar.health([1, 2], local=True, alive=lambda pid: False) == "dead"
    assert sidebar.health([1], local=False, alive=lambda pid: False) == "remote"  # a Slurm mesh: not from here
    assert sidebar.pid_alive(os.getpid()) and not sidebar.pid_alive(2**22 + 12345)


def test_action_messages():
    report = {"version": 4, "previous_version": 3, "total_seconds": 0.214, "gbps": 1.3, "skipped": False}
    assert sidebar.action_message("sync", report) == "policy v4 served in 214 ms (1.30 GB/s)"
    assert sidebar.action_message("sync", {**report, "total_seconds": 2.26}) == "policy v4 served in 2.3 s (1.30 GB/s)"
    assert sidebar.action_message("sync", {**report, "skipped": True}) == "policy v4 was already served"
    assert sidebar.action_message("pause", None) == "pausing after the step in flight"


class FakeComm:
    """What the Hub uses of an ipykernel comm: send, on_msg, on_close, close."""

    def __init__(self) -> None:
        self.sent: list[dict[str, Any]] = []
        self.on_msg_cb = self.on_close_cb = None
        self.got = threading.Condition()

    def send(self, data):
        with self.got:
            self.sent.append(data)
            self.got.notify_all()

    def on_msg(self, cb):
        self.on_msg_cb = cb

    def on_close(self, cb):
        self.on_close_cb = cb

    def close(self):
        self.on_close_cb({})

    def message(self, **data):
        self.on_msg_cb({"content": {"data": data}})

    def states(self) -> list[dict[str, Any]]:
        return [m for m in self.sent if m["type"] == "state"]

    def wait_for(self, predicate, timeout: float = 5.0, since: int = 0) -> dict[str, Any]:
        """The last message sent (from the `since`-th on) that satisfies `predicate`, waiting for one."""
        deadline = time.monotonic() + timeout
        with self.got:
            while True:
                found = [m for m in self.sent[since:] if predicate(m)]
                if found:
                    return found[-1]
                left = deadline - time.monotonic()
                assert left > 0, f"no such message in {self.sent}"
                self.got.wait(left)


class CountingStream(MetricsStream):
    """A metrics stream that counts its live subscribers."""

    def __init__(self) -> None:
        super().__init__()
        self.subscribers = 0

    def subscribe(self, notify):
        self.subscribers += 1
        unsubscribe = super().subscribe(notify)

        def undo():
            self.subscribers -= 1
            unsubscribe()

        return undo


class FakeSession:
    """The public Session API the sidebar relies on: status(), metrics_stream, sync/run/pause/resume."""

    def __init__(self) -> None:
        self.metrics_stream = CountingStream()
        self.trainer, self.generator, self.calls = 1, 0, []

    def status(self):
        return {**STATUS, "run": None, "policy_version": {"trainer": self.trainer, "generator": self.generator}}

    def sync(self):
        self.calls.append(("sync", threading.current_thread().name))
        self.generator = self.trainer
        return {"version": self.generator, "total_seconds": 0.1, "gbps": 2.0, "skipped": False}

    def run(self):
        raise RuntimeError("forge_nb: a background run is already running; stop() it first\nmore")


@pytest.fixture
def hub():
    current: dict[str, Any] = {"session": FakeSession()}
    hub = sidebar.Hub(current=lambda: current["session"], max_hz=20.0, alive=lambda pid: True)
    hub.current = current
    yield hub
    hub.close()


def test_open_answers_with_a_state_and_refresh_sends_another(hub):
    comm = FakeComm()
    hub.open(comm, {})
    first = comm.sent[0]
    assert first["type"] == "state" and first["protocol"] == sidebar.PROTOCOL
    assert first["session"]["policy"] == {"trainer": 1, "generator": 0, "staleness": 1}
    comm.message(type="refresh")
    assert len(comm.states()) >= 2


def test_sync_runs_off_the_handler_then_the_new_version_goes_out(hub):
    comm = FakeComm()
    hub.open(comm, {})
    comm.message(type="action", id=7, action="sync")
    result = comm.wait_for(lambda m: m["type"] == "result")
    assert result == {
        "type": "result",
        "id": 7,
        "action": "sync",
        "ok": True,
        "message": "policy v1 served in 100 ms (2.00 GB/s)",
    }
    assert hub.current["session"].calls == [("sync", hub.current["session"].calls[0][1])]
    assert hub.current["session"].calls[0][1].startswith("forge_nb-sidebar")  # not the comm handler's thread
    comm.wait_for(lambda m: m["type"] == "state" and m["session"]["policy"]["generator"] == 1)


def test_failed_and_unknown_actions_say_why(hub):
    comm = FakeComm()
    hub.open(comm, {})
    comm.message(type="action", id=1, action="run")
    failed = comm.wait_for(lambda m: m["type"] == "result" and m["id"] == 1)
    assert not failed["ok"]
    assert failed["message"] == "RuntimeError: forge_nb: a background run is already running; stop() it first"
    comm.message(type="action", id=2, action="rm -rf")
    assert "unknown action" in comm.wait_for(lambda m: m["type"] == "result" and m["id"] == 2)["message"]
    hub.current["session"] = None
    comm.message(type="action", id=3, action="sync")
    assert comm.wait_for(lambda m: m["type"] == "result" and m["id"] == 3)["message"] == (
        "RuntimeError: no session is up in this kernel"
    )


def test_states_are_throttled_and_follow_the_metrics(hub):
    """A burst of 500 step rows: a handful of states (at most max_hz per second), the last one with them all."""
    comm = FakeComm()
    hub.open(comm, {})
    stream = hub.current["session"].metrics_stream
    start = time.monotonic()
    for i in range(500):
        stream.emit("step", step=i, tokens_per_s=float(i))
        stream.emit("train", step=i)  # other kinds are not sparkline points
    last = comm.wait_for(lambda m: m["type"] == "state" and m["session"]["tokens_per_s"]["last"] == 499.0)
    elapsed = time.monotonic() - start
    assert last["session"]["tokens_per_s"]["history"] == [float(i) for i in range(500 - sidebar.HISTORY, 500)]
    assert len(comm.states()) <= 2 + elapsed * 20.0


def test_no_session_then_a_new_one_then_down(hub):
    comm = FakeComm()
    hub.current["session"] = None
    hub.open(comm, {})
    assert comm.sent[0]["session"] is None
    fresh = FakeSession()
    fresh.metrics_stream.emit("step", step=1, tokens_per_s=50.0)  # rows from before the sidebar looked
    hub.current["session"] = fresh
    state = comm.wait_for(lambda m: m["type"] == "state" and m["session"] is not None)
    assert state["session"]["tokens_per_s"]["history"] == [50.0]
    assert fresh.metrics_stream.subscribers == 1
    seen = len(comm.sent)
    hub.current["session"] = None
    comm.wait_for(lambda m: m["type"] == "state" and m["session"] is None, since=seen)
    assert fresh.metrics_stream.subscribers == 0  # the old session's stream is let go


def test_the_oldest_comms_are_closed_past_max_comms(hub):
    comms = [FakeComm() for _ in range(sidebar.MAX_COMMS + 2)]
    closed = []
    for i, comm in enumerate(comms):
        comm.close = lambda i=i: closed.append(i)
        hub.open(comm, {})
    assert closed == [0, 1]


def test_a_session_going_down_mid_read_shows_as_none(hub):
    def gone():
        raise AttributeError("'NoneType' object has no attribute 'describe'")

    hub.current["session"].status = gone
    assert hub.state()["session"] is None


def test_the_ticker_ends_with_the_last_comm(hub):
    comm = FakeComm()
    hub.open(comm, {})
    comm.close()
    deadline = time.monotonic() + 5
    while hub._ticker is not None and time.monotonic() < deadline:
        time.sleep(0.05)
    assert hub._ticker is None
    assert hub.current["session"].metrics_stream.subscribers == 0


def test_register_outside_a_kernel_is_a_no_op():
    class Shell:  # a terminal IPython: no kernel attribute
        pass

    assert sidebar.register(Shell()) is False
    assert sidebar.probe() == "no-kernel"  # no IPython at all under pytest


def test_register_in_a_kernel_registers_the_target_once(monkeypatch):
    class Manager:
        def __init__(self):
            self.targets = {}

        def register_target(self, name, handler):
            self.targets[name] = handler

    class Shell:
        kernel = type("Kernel", (), {"comm_manager": Manager()})()

    monkeypatch.setattr(sidebar, "_hub", None)
    shell = Shell()
    assert sidebar.register(shell) and sidebar.register(shell)
    assert list(shell.kernel.comm_manager.targets) == [sidebar.TARGET]
    hub = sidebar._hub
    assert shell.kernel.comm_manager.targets[sidebar.TARGET] == hub.open
    hub.close()
