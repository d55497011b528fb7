"""Local mesh helpers: after a stop, procs that outlive their mesh are killed (no process left behind)."""

import subprocess
import sys

from forge_nb.mesh import local


def test_reap_kills_a_proc_that_outlives_its_grace():
    lingering = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    procs = local.processes([lingering.pid])
    assert local.reap(procs, grace_s=0.2) == [lingering.pid]
    assert lingering.wait(5) == -9


def test_reap_waits_for_a_proc_that_exits_within_its_grace():
    quick = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.3)"])
    procs = local.processes([quick.pid])
    assert local.reap(procs, grace_s=10.0) == []  # a zombie until its parent waits: not running
    assert quick.wait(5) == 0


def test_processes_skips_pids_that_are_gone():
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()  # reaped: the pid no longer exists
    assert local.processes([gone.pid]) == []
