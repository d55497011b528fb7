"""Library noise stays out of a kernel's cells and goes to the log; everything else passes through."""

import os
import subprocess
import sys

from forge_nb.launch.quiet import is_noise

NOISE = [
    b"Monarch internal logs are being written to /tmp/root/monarch_log.log; execution id root_Nov-23_01:38_916\n",
    b"[RdmaXcel] Can't open libcuda.so.1: libcuda.so.1: cannot open shared object file: No such file or directory\n",
    b"INFO 11-23 12:57:01 [__init__.py:216] Automatically detected platform cpu.\n",
    b"(EngineCore_DP0 pid=4242) WARNING 11-23 12:57:03.123 [cpu.py:88] Pin memory is not supported on CPU.\n",
    b"/x/monarch/rdma.py:12: RDMATcpFallbackWarning: ibverbs is not available; using TCP\n",
]
KEPT = [
    b"HELLO from my reward\n",
    b"Traceback (most recent call last):\n",
    b"ERROR 11-23 12:57:01 [core.py:1] the engine died\n",
    b"forge_nb: every proc stopped\n",
]


def test_known_noise_is_recognised_and_output_is_not():
    assert all(is_noise(line) for line in NOISE)
    assert not any(is_noise(line) for line in KEPT)


# A process that routes its descriptors, then writes noise and output from itself and from a child
# that inherits them (as an actor proc does), with and without newlines.
CHILD = """
import os
os.write(2, open(os.environ["NOISE"], "rb").read())
os.write(1, b"kept: from a child\\n")
"""
SCRIPT = """
import os, subprocess, sys, time
from forge_nb.launch import quiet
path = quiet.route_native_output(force=True)
assert quiet.route_native_output(force=True) == path  # idempotent
os.write(2, open(os.environ["NOISE"], "rb").read())
os.write(1, b"kept: line one\\n")
subprocess.run([sys.executable, "-c", CHILD], check=True)
import logging
logging.getLogger("monarch._src.job.slurm").info("Submitting SLURM job with 1 nodes")
os.write(1, b"kept: no newline")
time.sleep(0.5)
open(os.environ["WHERE"], "w").write(str(path))
"""


def test_routed_descriptors_drop_noise_and_log_every_line(tmp_path):
    (tmp_path / "noise").write_bytes(b"".join(NOISE))
    script = tmp_path / "route.py"
    script.write_text(f"CHILD = {CHILD!r}\n{SCRIPT}")
    env = {**os.environ, "FORGE_NB_LOG_DIR": str(tmp_path / "logs"), "WHERE": str(tmp_path / "where")}
    env["NOISE"] = str(tmp_path / "noise")
    out = subprocess.run([sys.executable, str(script)], capture_output=True, env=env, timeout=60)
    assert out.returncode == 0, out.stderr
    shown = out.stdout + out.stderr
    assert b"kept: line one\n" in shown and b"kept: from a child\n" in shown and b"kept: no newline" in shown
    assert not any(line.strip() in shown for line in NOISE) and b"Submitting SLURM" not in shown
    log = open((tmp_path / "where").read_text(), "rb").read()
    assert all(log.count(line) == 2 for line in NOISE) and b"kept: from a child" in log
    assert b"monarch._src.job.slurm INFO: Submitting SLURM job with 1 nodes" in log


def test_turned_off_by_the_environment(tmp_path, monkeypatch):
    monkeypatch.setenv("FORGE_NB_QUIET", "0")
    code = "from forge_nb.launch import quiet; print(quiet.route_native_output(force=True))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "None", out.stderr
