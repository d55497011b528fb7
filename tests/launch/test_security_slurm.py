"""Nobody else's code on a Slurm job's nodes (#59), on the test Slurm (`tests.slurm_cluster`: fnode2 and fnode3 are
network namespaces): a session's job on fnode2 (its worker forge_nb's, on TLS with the job's own CA); strangers on
fnode3 who know the worker's address and port (any user can read them from squeue and the batch script) cannot
start a proc or run code there, get no byte of the weights, and garbage and floods on both ports leave the session
stepping and are said in its events. The job's CA lives in a 0700 folder of the job's log folder, named in the
batch script but not in it, and goes when the job is cancelled.

The session runs in a fresh process (`tests.fresh`: its Monarch listens on TLS, for good)."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import time
from pathlib import Path

import pytest

from forge_nb.launch.slurm import worker_bootstrap
from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from forge_nb.testing import netns_hosts
from tests.conftest import wait_no_children
from tests.fresh import in_fresh_process

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
MODES = ("plain", "no-cert", "own-ca")


def test_the_batch_script_runs_forge_nbs_worker_with_the_jobs_credentials():
    line = worker_bootstrap(26700, "/shared/logs/credentials-1a2b")
    assert line.endswith('slurm_worker(26700, "/shared/logs/credentials-1a2b")') and "'" not in line
    with pytest.raises(Exception, match="single quote"):
        worker_bootstrap(26700, "/shared/it's/credentials")


def run_in(netns: str, *args: str, timeout: float = 120) -> str:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))}
    command = ["ip", "netns", "exec", netns, sys.executable, *args]
    return subprocess.run(command, env=env, capture_output=True, text=True, timeout=timeout, cwd=ROOT).stdout


def intruded_job(logs: str, node: str, stranger: str, stranger_ip: str, tmp: str) -> dict:
    """A session on `node` (its netns), strangers in the netns `stranger`: what they got, what the session said."""
    s = Session.up(
        mesh={"kind": "slurm"},
        slurm={"log_dir": logs, "exclusive": False, "partition": "multi", "sbatch_args": ["--nodelist=fnode2"]},
        weights={"transport": "tcp"},
        prompts_per_step=4,
        group_size=4,
        threads_per_proc=1,
        engine="torch",
    )
    try:
        mesh = s.fleet.mesh
        worker = f"{mesh.addresses[0]}:{mesh.ports[0]}"
        folder = Path(mesh.job.credentials)
        script = subprocess.run(["scontrol", "write", "batch_script", mesh.job_id, "-"], capture_output=True, text=True)
        got: dict = {
            "worker": worker,
            "folder_mode": stat.S_IMODE(folder.stat().st_mode),
            "key_mode": stat.S_IMODE((folder / "ca.key").stat().st_mode),
            "script_names_folder": str(folder) in script.stdout and "PRIVATE KEY" not in script.stdout,
        }
        before = set(netns_hosts.pids_inside(node))
        markers = {mode: Path(tmp) / f"marker-{mode}" for mode in MODES}
        intruders = [
            subprocess.Popen(
                ["ip", "netns", "exec", stranger, sys.executable, "-m", "tests.launch.intruder", worker, stranger_ip]
                + [str(markers[mode]), mode, str(Path(tmp) / mode)],
                env={**os.environ, "PYTHONPATH": str(ROOT)},
                stdout=subprocess.PIPE,
                stderr=subprocess.DEVNULL,
                text=True,
                cwd=ROOT,
            )
            for mode in MODES
        ]
        outs = [p.communicate(timeout=120)[0] for p in intruders]
        got["intruders"] = [json.loads(o.split("RESULT ", 1)[1]) if "RESULT " in o else o[-500:] for o in outs]
        got["markers"] = [m.exists() for m in markers.values()]
        got["left_on_node"] = sorted(set(netns_hosts.pids_inside(node)) - before)
        stream = wait(s.fleet.trainer.weights_manifest.call_one()).stream
        code = (
            "import os, socket, struct, sys\n"
            "s = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)\n"
            "first = s.recv(64); s.sendall(os.urandom(64) + struct.pack('!BQQ', 0, 0, 1 << 20)); rest = b''\n"
            "try:\n    while c := s.recv(65536): rest += c\nexcept ConnectionResetError: pass\n"
            "print(len(first), len(rest))\n"
        )
        got["stream_hosts"] = list(stream.hosts)
        got["no_secret_read"] = run_in(stranger, "-c", code, stream.hosts[0], str(stream.port)).split()
        flood = (
            "import os, socket, sys, time\n"
            "held = []\n"
            "for port in map(int, sys.argv[2:]):\n"
            "    for _ in range(10):\n"
            "        with socket.create_connection((sys.argv[1], port)) as g: g.sendall(os.urandom(4096))\n"
            "    held += [socket.create_connection((sys.argv[1], port)) for _ in range(150)]\n"
            "print(len(held), flush=True); time.sleep(8)\n"
        )
        address, port = worker.rsplit(":", 1)
        command = ["ip", "netns", "exec", stranger, sys.executable, "-c", flood, address, port, str(stream.port)]
        flooding = subprocess.Popen(command, stdout=subprocess.PIPE, text=True)
        got["held"] = int(flooding.stdout.readline())
        got["steps_during_flood"] = len(s.step(2))
        flooding.wait(timeout=60)
        deadline, said = time.monotonic() + 60, ""
        while time.monotonic() < deadline:  # the session asks its procs at a step boundary (refusals.POLL_S)
            said = " ".join(e["what"] for e in s.metrics_stream.rows("event") if e["role"] == "security")
            if f"worker {address}:{port}: handshake not finished" in said and "weights stream" in said:
                break
            s.step(1)
            time.sleep(1.0)
        got["said"] = said
        sums = s.checksums()
        got["in_step"] = sums["generator"] == sums["trainer"]
        got["folder"] = str(folder)
        return got
    finally:
        s.down()


def test_strangers_on_another_node_cannot_run_code_on_a_jobs_worker_nor_read_its_weights(slurm, tmp_path):
    stranger = slurm.host("fnode3")
    got = in_fresh_process(
        intruded_job, str(tmp_path / "logs"), slurm.host("fnode2").netns, stranger.netns, stranger.ip, str(tmp_path)
    )
    assert got["folder_mode"] == 0o700 and got["key_mode"] == 0o600 and got["script_names_folder"], got
    assert [i["ran"] for i in got["intruders"]] == [False] * len(MODES), got["intruders"]
    assert got["markers"] == [False] * len(MODES) and got["left_on_node"] == [], got
    assert got["stream_hosts"] == [got["worker"].rsplit(":", 1)[0]]  # the node's address only
    assert got["no_secret_read"] == ["32", "0"]  # the server's nonce, then not a byte of a buffer
    assert got["held"] == 300 and got["steps_during_flood"] == 2 and got["in_step"]
    assert f"worker {got['worker']}: handshake not finished" in got["said"], got["said"]
    assert "weights stream" in got["said"] and "no secret" in got["said"], got["said"]
    assert not Path(got["folder"]).exists()  # the job's CA went with the job
    assert slurm.wait_no_jobs() == [] and slurm.live_steps() == []
    assert wait_no_children(exclude=slurm.daemons) == []
