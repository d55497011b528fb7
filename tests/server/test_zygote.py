"""The zygote: session servers forked from a warm interpreter of the client's context, which refuses what a fresh
server would not be, lets in only this user with its key, and ends when idle, when its folder goes, and with
`forge-nb down --all`. Real zygotes and servers, the bundled model."""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import time
import types
from multiprocessing import AuthenticationError
from multiprocessing.connection import Client
from pathlib import Path

import psutil
import pytest

import forge_nb
from forge_nb.server import start, zygote
from forge_nb.server.handshake import prove_to_server
from forge_nb.server.registry import SessionDir, runtime_dir
from tests.conftest import wait_gone

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}


@pytest.fixture
def own_runtime(monkeypatch):
    """A runtime folder of this test's (a short path: a Unix socket's is at most 107 bytes), where this process
    starts zygotes (`FORGE_NB_ZYGOTE=1`: a kernel's default); they are stopped at its end."""
    folder = Path(tempfile.mkdtemp(prefix="zyg-"))
    monkeypatch.setenv("FORGE_NB_RUNTIME_DIR", str(folder))
    monkeypatch.setenv(zygote.ENV, "1")
    yield folder
    for home in zygote.homes():  # shown with a failure: what each zygote said
        if (home / zygote.LOG).exists():
            print(f"{home / zygote.LOG}:\n{(home / zygote.LOG).read_text()}")
    ended = zygote.stop_all()
    assert wait_gone(ended, 10) == []
    shutil.rmtree(folder)


def _server(s) -> psutil.Process:
    return psutil.Process(SessionDir.named(s.name).info().pid)


def test_the_second_session_is_forked_by_the_zygote_the_first_one_started(own_runtime, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with forge_nb.up(persist=False, **SMALL) as first:
        server = _server(first)
        parent = server.parent()
        assert "--zygote" in parent.cmdline() and zygote.pids() == [parent.pid]
        first.step(1)
    mask = os.umask(0o027)  # the server takes the client's umask, folder and environment
    try:
        with forge_nb.up(persist=False, **SMALL) as second:
            again = _server(second)
            assert again.parent().pid == parent.pid and again.pid != server.pid  # the same zygote, a new server
            folder = SessionDir.named(second.name)
            assert again.cmdline() == [sys.executable, "-m", "forge_nb.server", str(folder.path)]  # as in ps
            assert again.cwd() == str(tmp_path)
            assert f"Umask:\t{0o027:04o}" in open(f"/proc/{again.pid}/status").read()
            assert os.getsid(again.pid) == again.pid  # a session of its own: a kernel's restart does not reach it
            assert "forge_nb" in folder.log.read_text()  # its output goes to its own log, in its folder
            assert second.step(1).iloc[-1].policy_version == 1
    finally:
        os.umask(mask)
    assert wait_gone([server.pid, again.pid], 10) == []
    assert zygote.pids() == [parent.pid]  # it stays for the next session
    assert f"zygote {parent.pid}: ended" in start.down(None)  # forge-nb down --all ends it
    assert not any(p.name.startswith(zygote.PREFIX) for p in runtime_dir().iterdir())


def test_only_this_user_holding_the_key_is_served_and_an_idle_zygote_ends(own_runtime, monkeypatch):
    monkeypatch.setenv(zygote.IDLE_ENV, "3")
    home = zygote._home(zygote.context_key())
    conn = zygote._start_and_connect(home)  # a real zygote, its imports done
    conn.close()
    pid = zygote.running(home)
    assert pid is not None and oct(os.stat(home / zygote.SOCKET).st_mode)[-3:] == "600"
    stranger = Client(str(home / zygote.SOCKET), family="AF_UNIX")
    with pytest.raises(AuthenticationError):
        prove_to_server(stranger, b"not the key")
    stranger.close()
    assert zygote.running(home) == pid  # it goes on: the next client with the key is served
    child = zygote.spawn(own_runtime / "absent")  # a folder that is not there: the child cannot open its log
    assert child is not None and wait_gone([child], 10) == []  # and exits; it never serves as a second zygote
    assert wait_gone([pid], 30) == []  # idle for 3 s: it ends, and clears its files
    assert sorted(p.name for p in home.iterdir()) == [zygote.LOCK]


def test_a_zygote_whose_folder_goes_ends(own_runtime):
    home = zygote._home(zygote.context_key())
    zygote._start_and_connect(home).close()
    pid = zygote.running(home)
    (home / zygote.SOCKET).unlink()  # (the runtime folder removed, as a test run's temp folder is at its end)
    assert wait_gone([pid], 10) == []


def test_a_kernel_starts_a_zygote_and_a_script_only_uses_one(own_runtime, monkeypatch):
    monkeypatch.delenv(zygote.ENV, raising=False)
    monkeypatch.delitem(sys.modules, "ipykernel", raising=False)
    assert zygote.wanted() and not zygote.may_start()  # a script's would outlive it, for no next session
    assert zygote.spawn(runtime_dir() / "x") is None and not zygote.homes()  # (nor a folder for one)
    monkeypatch.setitem(sys.modules, "ipykernel", types.ModuleType("ipykernel"))
    assert zygote.may_start()
    monkeypatch.setenv(zygote.ENV, "0")
    assert not zygote.wanted() and not zygote.may_start()
    monkeypatch.setenv(zygote.ENV, "1")
    monkeypatch.delitem(sys.modules, "ipykernel")
    assert zygote.may_start()


def test_the_context_key_leaves_out_what_tools_set_per_process(monkeypatch):
    key = zygote.context_key()
    monkeypatch.setenv("PYTEST_CURRENT_TEST", "another")
    monkeypatch.setenv("JPY_SESSION_NAME", "/some/notebook.ipynb")
    assert zygote.context_key() == key
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "3")  # what an import or the server may read: another zygote
    assert zygote.context_key() != key
    monkeypatch.setenv(zygote.ENV, "0")
    assert zygote.spawn(runtime_dir() / "x") is None


def test_a_module_in_the_clients_folder_that_a_fresh_server_would_import_is_refused(tmp_path):
    (tmp_path / "json.py").write_text("")  # shadows the standard library's, which a fresh `python -m` there would
    (tmp_path / "notebooks").mkdir()  # not a module imported
    (tmp_path / "psutil").mkdir()  # a folder without __init__.py: the installed package wins over it
    assert zygote._shadowed(str(tmp_path)) == ["json"]
    (tmp_path / "json.py").unlink()
    (tmp_path / "forge_nb").symlink_to(os.path.dirname(forge_nb.__file__))  # the same files: a checkout's root
    assert zygote._shadowed(str(tmp_path)) == []


def test_a_zygote_whose_imported_files_changed_refuses_and_ends(tmp_path):
    module = tmp_path / "edited.py"
    module.write_text("")
    z = zygote.Zygote.__new__(zygote.Zygote)
    z.ending, z.loaded = False, {str(module): os.stat(module).st_mtime}
    request = zygote.Spawn(str(tmp_path), str(tmp_path), 0o022, {})
    assert z._refusal(request) is None
    time.sleep(0.01)
    module.write_text("x = 1")
    os.utime(module, (time.time() + 5, time.time() + 5))
    assert "changed since it started" in z._refusal(request)
    assert z.ending  # the next client starts a zygote that imports the code as it is now
