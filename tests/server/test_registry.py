"""Where sessions are found (unit: no server)."""

from __future__ import annotations

import os
import stat
import time

import psutil
import pytest

from forge_nb.server.registry import RegistryError, SessionDir, SessionInfo, private, runtime_dir, valid_name


def test_the_runtime_folder_is_made_private_and_one_of_another_user_is_refused(tmp_path, monkeypatch):
    folder = tmp_path / "runtime"
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(folder))
    assert runtime_dir() == folder and stat.S_IMODE(folder.stat().st_mode) == 0o700
    os.chmod(folder, 0o755)
    runtime_dir()
    assert stat.S_IMODE(folder.stat().st_mode) == 0o700  # opened up by someone: closed again
    other = tmp_path / "theirs"
    other.mkdir()
    os.chown(other, 4242, 4242)  # (the suite runs as root; elsewhere: skip)
    with pytest.raises(RegistryError, match="belongs to uid 4242"):
        private(other)


def test_names_are_short_and_plain():
    assert valid_name("01_quickstart-3fa2") == "01_quickstart-3fa2"
    for bad in ("", "../x", "a/b", "-x", "x" * 65, "a b"):
        with pytest.raises(RegistryError, match="letters, digits"):
            valid_name(bad)


def test_a_session_folder_holds_a_private_key_and_its_info_and_refuses_a_running_name(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(tmp_path))
    folder = SessionDir.named("exp1")
    folder.create()
    assert len(folder.key()) == 32 and stat.S_IMODE((folder.path / "key").stat().st_mode) == 0o600
    folder.write_info(SessionInfo("exp1", os.getpid(), os.uname().nodename, time.time(), state="up", step=3))
    assert folder.info().step == 3 and folder.info().alive  # (this process stands for its server)
    with pytest.raises(RegistryError, match="is running"):
        SessionDir.named("exp1").create()
    folder.write_info(SessionInfo("exp1", 2**22 + 17, os.uname().nodename, time.time() - 7200, last_checkpoint="/c"))
    row = folder.info().row()
    assert row["state"] == "gone" and row["last_checkpoint"] == "/c" and row["age"] == "2.0 h"
    SessionDir.named("exp1").create()  # a gone session's name is free again: a new key
    folder.remove()
    assert not folder.path.exists()


def test_a_name_is_taken_from_its_create_and_a_reused_pid_is_not_the_server(tmp_path, monkeypatch):
    from forge_nb.server.start import free_name

    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(tmp_path))
    SessionDir.named("train").create()  # a start in progress: its server has not written its info yet
    info = SessionDir.named("train").info()
    assert info.state == "starting" and info.pid == os.getpid() and info.alive
    assert free_name("train") == "train-2"  # a second script started meanwhile gets a name of its own
    me = psutil.Process()
    reused = SessionInfo("x", me.pid, os.uname().nodename, time.time(), state="up", pid_started=me.create_time() - 99)
    assert not reused.alive  # the pid runs, but another process has it now (a reboot, years of uptime)
    assert SessionInfo("x", me.pid, os.uname().nodename, time.time(), pid_started=me.create_time()).alive


def test_a_stalled_handshake_ends_at_its_deadline():
    from multiprocessing import Pipe

    from forge_nb.server.handshake import Deadline

    ours, theirs = Pipe()
    start = time.monotonic()
    with pytest.raises(TimeoutError):
        Deadline(ours, time.monotonic() + 0.3).recv_bytes(256)  # the peer sends nothing
    assert 0.25 < time.monotonic() - start < 5
    theirs.send_bytes(b"x")
    assert Deadline(ours, time.monotonic() + 5).recv_bytes(256) == b"x"


def test_a_down_that_fails_is_told_to_the_client_and_the_server_ends_anyway(tmp_path):
    import threading
    import types

    from forge_nb.server.protocol import Hello
    from forge_nb.server.server import SessionServer

    class Stuck:
        run_dir = str(tmp_path / "run")

        def down(self):
            raise RuntimeError("forge_nb: procs did not stop cleanly: trainer (pid 4242)")

    server = SessionServer.__new__(SessionServer)
    server.folder = SessionDir(tmp_path / "s")
    server.folder.path.mkdir()
    server.info = SessionInfo("s", os.getpid(), os.uname().nodename, time.time(), state="up")
    server._lock, server.calls_in_flight, server.ending = threading.Lock(), 0, threading.Event()
    waited = []
    service = types.SimpleNamespace(session=Stuck(), finish_commands=waited.append)
    server.service, server.run_dir = service, None
    kind, failure = server._answer(Hello.here("test"), "down", (), {}, True)
    assert kind == "error" and "trainer (pid 4242)" in str(failure.exception())
    assert server.ending.is_set() and server.service is None  # it ends; a call meanwhile is SessionDown
    assert server.folder.info().state == "down" and server.run_dir == tmp_path / "run"  # (its log goes there)
    assert waited  # another client's command in flight was let end first
