"""The session server's fork server, forked from the server before Monarch (`forge_nb.launch.forks.early`): in a
script standing in for ``python -m forge_nb.server``; the session path is in tests/server/test_server.py."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import psutil

from forge_nb.launch.shared_cores import SPINCOUNT
from tests.conftest import wait_gone

ROOT = Path(__file__).parents[3]
MODULE = "tests.launch.forks.forked_main"


def _script(body: str, *, wait: bool = True) -> subprocess.Popen:
    code = "import json, os, sys\nfrom forge_nb.launch.forks import early, server as forkserver\n"
    code += textwrap.dedent(body)
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    if wait:
        proc.wait(120)
    return proc


def test_the_forked_server_is_ready_at_once_taken_by_the_first_mesh_and_forks_procs_with_torch_imported():
    proc = _script(
        f"""
        for name in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT"):  # the suite sets a wait policy (conftest.py)
            os.environ.pop(name, None)
        early.start()
        server = forkserver.acquire({{}})  # what the session's LocalMesh asks for
        taken = server is early._server and server.proc.pid != os.getpid()
        ready = server.wait_ready(30)
        import subprocess
        env = {{**os.environ, "PYTHONPATH": {str(ROOT)!r}, "FORKED": "report"}}
        child = subprocess.run([sys.executable, "-m", "forge_nb.launch.forks.client", server.path, {MODULE!r}],
                               env=env, cwd={str(ROOT)!r}, capture_output=True, text=True, timeout=60)
        early.drop_unused()  # taken: it stays
        alive = server.proc.poll() is None
        os.environ[forkserver.LINGER_ENV] = "0"  # (the suite's 900 would keep it)
        forkserver.release(server)
        gone = server.proc.poll() is not None
        print(json.dumps({{"taken": taken, "ready": ready, "child": json.loads(child.stdout), "alive": alive,
                          "server": server.proc.pid, "spin": os.environ.get("GOMP_SPINCOUNT"), "gone": gone}}))
        """
    )
    out = json.loads(proc.stdout.read().splitlines()[-1])
    assert proc.returncode == 0
    assert out["taken"] and out["ready"] and out["alive"] and out["gone"]
    assert out["child"]["torch"] and out["child"]["ppid"] == out["server"]  # forked from it, torch imported there
    assert out["spin"] == SPINCOUNT  # the procs' short spin, seen by the imports (`shared_cores.proc_env`)


def test_a_server_no_mesh_took_is_stopped_once_the_session_is_up():
    proc = _script(
        """
        early.start()
        pid = early._server.proc.pid
        early.drop_unused()
        print(json.dumps({"pid": pid, "code": early._server.proc.poll(), "folder": early._server.folder.exists()}))
        """
    )
    out = json.loads(proc.stdout.read().splitlines()[-1])
    assert proc.returncode == 0 and out["code"] is not None and not out["folder"]
    assert wait_gone([out["pid"]], 10) == []


def test_the_forked_server_ends_with_the_process_it_was_forked_from_even_killed():
    proc = _script(
        """
        early.start()
        print(json.dumps({"pid": early._server.proc.pid}), flush=True)
        import time
        time.sleep(120)  # until the test kills this process
        """,
        wait=False,
    )
    pid = json.loads(proc.stdout.readline())["pid"]
    assert psutil.pid_exists(pid)
    proc.send_signal(signal.SIGKILL)
    proc.wait(10)
    assert wait_gone([pid], 10) == []  # its pidfd of the parent said so


def test_no_server_is_forked_once_monarch_is_imported_or_when_turned_off():
    proc = _script(
        """
        import monarch.actor  # its runtime's threads: a fork could not carry them
        early.start()
        print(json.dumps({"after_monarch": early._server is None}))
        """
    )
    assert json.loads(proc.stdout.read().splitlines()[-1]) == {"after_monarch": True}
    code = "import os; os.environ['FORGE_NB_FORK_PREFORK'] = '0'\nfrom forge_nb.launch.forks import early\n"
    code += "early.start(); print(early._server is None)"
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "True"
