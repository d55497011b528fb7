"""A session in its server: clients attach and detach, share it, cannot hurt it; it ends on down, when idle, or
with its script; killed, it takes its procs with it. Real servers, the bundled model."""

from __future__ import annotations

import json
import os
import pickle
import signal
import socket
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client, answer_challenge, deliver_challenge

import psutil
import pytest

import forge_nb
from forge_nb.live.capture import LiveCodeError
from forge_nb.server.client import SessionClient, SessionGone
from forge_nb.server.protocol import Hello, ServerTraceback
from forge_nb.server.registry import SessionDir
from forge_nb.state import SessionError
from tests.conftest import wait_gone, wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}


@pytest.fixture(scope="module")
def shared():
    s = forge_nb.up(name="shared", persist=False, **SMALL)
    yield s
    s.down()
    assert wait_no_children(30) == []


def _script(tmp_path, body: str, *args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    path = tmp_path / "client.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path), *args], capture_output=True, text=True, timeout=timeout)


def test_a_script_attaches_to_the_session_and_sees_its_versions_and_samples(shared, tmp_path):
    shared.step(2)
    shared.set_reward(lambda prompt, completion, target: float(completion.strip() == target), name="exact", weight=0)
    out = _script(
        tmp_path,
        """
        import json, forge_nb
        c = forge_nb.attach("shared")
        print(json.dumps({"step": c.step_count, "policy": c.trainer_version, "versions": len(c.versions()),
                          "samples": c.samples(8).index.tolist(), "who": c.status()["session"]}))
        c.detach()
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    assert seen == {
        "step": shared.step_count,
        "policy": shared.trainer_version,
        "versions": len(shared.versions()),
        "samples": shared.samples(8).index.tolist(),
        "who": "shared",
    }
    assert shared.step(1).index[-1] == seen["step"] + 1  # the script's detach left the session as it was


def test_a_step_while_another_clients_background_run_runs_is_refused_naming_who_started_it(shared, tmp_path):
    shared.run()
    try:
        out = _script(
            tmp_path,
            """
            import forge_nb
            c = forge_nb.attach("shared")
            try:
                c.step(1)
            except Exception as e:
                print("REFUSED", e)
            c.detach()
            """,
        )
    finally:
        shared.stop()
    assert "REFUSED forge_nb: step refused: a background run started by" in out.stdout, out.stdout + out.stderr
    assert f"{os.getpid()}" in out.stdout  # it names this process, which started the run


def test_a_second_clients_step_waits_for_the_first_after_saying_who_holds_the_session(shared, capsys):
    other = SessionClient(SessionDir.named("shared"))
    start = shared.step_count
    first = threading.Thread(target=shared.step, args=(6,), kwargs={"progress": False})
    first.start()
    while shared.step_count == start:  # the first step holds the session
        time.sleep(0.05)
    try:
        other.step(1, progress=False)
    finally:
        first.join()
        other.detach()
    assert "is busy (step for" in capsys.readouterr().out
    assert shared.step_count == start + 7  # serialised, both done


def test_the_sessions_procs_fork_from_a_fork_server_forked_from_its_server(shared):
    server = psutil.Process(SessionDir.named("shared").info().pid)
    forks = [c for c in server.children() if c.cmdline() == server.cmdline()]  # (`launch.forks.early`)
    assert len(forks) == 1, [c.cmdline() for c in server.children()]
    procs = [p for ps in shared.pids.values() for p in ps]
    assert procs and all(psutil.Process(p).ppid() == forks[0].pid for p in procs)


def test_errors_reach_the_client_as_themselves_with_the_servers_traceback(shared):
    with pytest.raises(LiveCodeError, match="returned str") as raised:
        shared.set_reward(lambda prompt, completion, target: "yes")
    cause = raised.value.__cause__
    assert isinstance(cause, ServerTraceback) and "in the session's server" in str(cause)
    with pytest.raises(SessionError, match="takes a rollout this session made"):
        shared.train(None)


def test_a_rollout_stays_in_the_server_and_trains_from_its_handle(shared):
    r = shared.rollout()
    assert len(r) == 16 and r.to_pandas().shape[0] == 16 and len(r.episodes[0].completion_ids) > 0
    assert set(r.agent_stats) == {"turns", "tool_calls", "tool_errors"}  # NaN each: no agent ran (tutorial 08 reads it)
    assert shared.train(r)["policy_version"] == shared.trainer_version


def test_bad_input_on_the_socket_never_hurts_the_session(shared):
    folder = SessionDir.named("shared")
    address = str(folder.socket)
    raw = socket.socket(socket.AF_UNIX)
    raw.connect(address)
    raw.sendall(b"\x00garbage" * 1000)  # no handshake: dropped
    raw.close()
    with pytest.raises((AuthenticationError, EOFError, OSError)):  # the wrong key: refused in the handshake
        bad = Client(address, family="AF_UNIX")
        answer_challenge(bad, b"not the key")
    conn = Client(address, family="AF_UNIX")
    answer_challenge(conn, folder.key())
    deliver_challenge(conn, folder.key())
    conn.send(Hello.here("garbage"))
    conn.send_bytes(b"not a pickle")  # authenticated, then nonsense: that connection closes
    conn.close()
    conn = Client(address, family="AF_UNIX")
    answer_challenge(conn, folder.key())
    deliver_challenge(conn, folder.key())
    conn.send(Hello.here("leaver"))
    conn.send(("call", "step", (2,), {}, True))
    conn.close()  # gone mid-call: the server's answer has nowhere to go
    flood = [socket.socket(socket.AF_UNIX) for _ in range(50)]
    for s in flood:
        s.connect(address)  # half-open: each waits out its handshake deadline alone
    try:
        before = shared.step_count
        shared.step(1)
        assert shared.step_count >= before + 1
    finally:
        for s in flood:
            s.close()
    assert pickle.loads(pickle.dumps(shared.status()))["up"]


def test_an_interrupted_step_stops_at_its_next_step_boundary(shared):
    """Ctrl-C in a cell that waits on `step(n)`: the client closes its connection and asks the server to stop,
    and the steps stop at the next boundary instead of running all n (the step in flight ends whole)."""
    before = shared.step_count
    old = signal.signal(signal.SIGINT, signal.default_int_handler)  # as in a kernel (an xdist worker may differ)
    timer = threading.Timer(2.0, os.kill, (os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            shared.step(1000, progress=False)
    finally:
        timer.cancel()
        signal.signal(signal.SIGINT, old)
    shared.step(1, progress=False)  # waits for the interrupted call's last step, then takes its own turn
    ran = shared.step_count - before - 1
    assert 0 <= ran < 1000, f"all {ran} steps ran: the interrupt did not stop them"
    sums = shared.checksums()
    assert sums["generator"] == sums["trainer"]  # the step in flight ended whole: trained and synced


def test_a_session_no_one_holds_ends_itself_after_its_idle_timeout(tmp_path):
    out = _script(
        tmp_path,
        """
        import json, forge_nb
        s = forge_nb.up(name="idle", persist=True, idle_timeout_s=2, prompts_per_step=2, group_size=2,
                        threads_per_proc=1)
        print(json.dumps({"server": s.status()["session"], "pids": [p for ps in s.pids.values() for p in ps]}))
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    pids = json.loads(out.stdout.strip().splitlines()[-1])["pids"]
    deadline = time.monotonic() + 60
    while "idle" in forge_nb.ps().index and time.monotonic() < deadline:
        time.sleep(0.5)
    assert "idle" not in forge_nb.ps().index
    assert wait_gone(pids, 30) == []


def test_ps_lists_this_users_sessions_and_down_all_ends_them(tmp_path, monkeypatch):
    # A folder of sessions of its own: --all would end the module's shared session (its scripts inherit it).
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", tempfile.mkdtemp(prefix="sessions-"))
    for name in ("left-1", "left-2"):
        out = _script(
            tmp_path,
            f"""
            import forge_nb
            forge_nb.up(name="{name}", persist=True, prompts_per_step=2, group_size=2, threads_per_proc=1).detach()
            """,
        )
        assert out.returncode == 0, out.stderr[-3000:]
    listed = subprocess.run([sys.executable, "-m", "forge_nb.cli", "ps"], capture_output=True, text=True, timeout=60)
    assert "left-1" in listed.stdout and "left-2" in listed.stdout and " up " in listed.stdout, listed.stdout
    servers = [SessionDir.named(n).info().pid for n in ("left-1", "left-2")]
    done = subprocess.run([sys.executable, "-m", "forge_nb.cli", "down", "--all"], capture_output=True, text=True)
    assert "left-1: down" in done.stdout and "left-2: down" in done.stdout, done.stdout + done.stderr
    assert wait_gone(servers, 30) == [] and len(forge_nb.ps()) == 0


def test_a_killed_server_takes_its_procs_and_attach_says_it_is_gone_naming_its_last_checkpoint(tmp_path):
    saved = tmp_path / "ckpt"
    out = _script(
        tmp_path,
        f"""
        import json, forge_nb
        s = forge_nb.up(name="killed", persist=True, prompts_per_step=2, group_size=2, threads_per_proc=1)
        s.step(1)
        s.save("{saved}")
        print(json.dumps([p for ps in s.pids.values() for p in ps]))
        s.detach()
        """,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    procs = json.loads(out.stdout.strip().splitlines()[-1])
    folder = SessionDir.named("killed")
    time.sleep(2.5)  # a heartbeat: info.json names the checkpoint
    server = folder.info().pid
    forks = [c.pid for c in psutil.Process(server).children()]  # its fork server among them
    os.kill(server, signal.SIGKILL)
    assert wait_gone([server, *procs, *forks], 30) == []  # Monarch takes the procs down with their controller
    with pytest.raises(SessionGone, match=f"its last checkpoint: {saved}"):
        forge_nb.attach("killed")
    assert forge_nb.ps().loc["killed", "state"] == "gone"
    done = subprocess.run([sys.executable, "-m", "forge_nb.cli", "down", "killed"], capture_output=True, text=True)
    assert "killed: gone; its folder cleared" in done.stdout and not folder.path.exists()


def test_a_scripts_session_ends_when_its_script_is_killed(tmp_path):
    script = tmp_path / "owner.py"
    script.write_text(
        textwrap.dedent(
            """
            import json, sys, forge_nb
            s = forge_nb.up(name="owned", prompts_per_step=2, group_size=2, threads_per_proc=1)
            print(json.dumps([s.status()["session"], [p for ps in s.pids.values() for p in ps]]), flush=True)
            sys.stdin.read()
            """
        )
    )
    owner = subprocess.Popen([sys.executable, str(script)], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        _, procs = json.loads(owner.stdout.readline())
        server = SessionDir.named("owned").info().pid
        owner.kill()  # SIGKILL: no exit hook runs in the script
        owner.wait()
        assert wait_gone([server, *procs], 60) == []
    finally:
        owner.kill()
    assert "owned" not in forge_nb.ps().index
    assert psutil.pid_exists(server) is False or psutil.Process(server).status() == psutil.STATUS_ZOMBIE


def test_the_agents_endpoint_is_served_by_the_sessions_server_and_asks_for_its_token(shared):
    import requests

    endpoint = shared.endpoint()
    assert requests.get(f"{endpoint.url}/models", timeout=10).status_code == 401
    headers = {"Authorization": f"Bearer {endpoint.api_key}"}
    assert requests.get(f"{endpoint.url}/models", headers=headers, timeout=10).status_code == 200
    with shared.trajectory({"prompt": "1+1="}) as t:  # opened in the server, for an agent elsewhere
        auth = {"Authorization": f"Bearer {t.api_key}"}
        assert requests.get(f"{t.base_url}/models", headers=auth, timeout=10).status_code == 200
        t.reward(1.0)
    assert requests.get(f"{t.base_url}/models", headers=auth, timeout=10).status_code == 404  # closed


def test_while_its_session_goes_down_the_server_says_so_and_is_up_reads_false():
    """`down` takes seconds, and the server answers calls meanwhile: with SessionDown, which a client's `is_up`
    reads as False (a dashboard's ticker asked `is_up` in that window and printed a traceback into the notebook)."""
    from forge_nb.errors import SessionDown
    from forge_nb.server.server import SessionServer

    server = SessionServer.__new__(SessionServer)  # between `_client_down`'s two halves: no service
    server._lock, server.calls_in_flight, server.service = threading.Lock(), 0, None
    kind, failure = server._answer(Hello.here("test"), "facts", (), {}, False)
    assert kind == "error" and isinstance(failure.exception(), SessionDown)

    def answer(method, *args, **kwargs):
        raise failure.exception()

    client = SessionClient.__new__(SessionClient)
    client._closed, client._call = False, answer
    assert client.is_up is False


def test_a_fork_is_held_by_a_client_of_the_forking_clients_class(monkeypatch):
    """A notebook's `s.fork(step)` is a notebook session too: `dashboard()` on it (tutorial 09) was missing."""
    import forge_nb.server.start as start
    from forge_nb.notebook.session import NotebookSession

    seen = {}
    monkeypatch.setattr(start, "resume", lambda path, client_class: seen.update(path=path, cls=client_class))
    client = NotebookSession.__new__(NotebookSession)
    client._closed, client._call = False, lambda method, step: f"/checkpoints/{method}-{step}"
    client.fork(60)
    assert seen == {"path": "/checkpoints/checkpoint_before-60", "cls": NotebookSession}
