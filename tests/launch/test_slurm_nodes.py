"""A session over several nodes of a real multi-node Slurm (`tests.slurm_cluster`: three slurmd, fnode2 and
fnode3 each in a network namespace of its own, started here): the trainer's FSDP gang over two nodes (gloo
across the namespace network), the generator on the third; a node lost mid-run; an exported run's sbatch
over three nodes. Each session is its process's first Monarch use (a mesh over several hosts listens on TCP):
the three-node session in a real kernel started here (`%forge up --slurm`), the others in a fresh process
(`tests.fresh`)."""

from __future__ import annotations

import json
import re
import subprocess
import time

import pytest

from forge_nb.config import Config
from forge_nb.export import export_config
from forge_nb.launch.hosts import HostLost
from forge_nb.session import Session, SessionError
from forge_nb.testing import netns_hosts
from tests.conftest import forked_roles, wait_no_children
from tests.fresh import in_fresh_process
from tests.notebook.kernel import Kernel
from tests.slurm_cluster import queued_jobs

pytestmark = pytest.mark.slow

SHAPE = {"mesh.trainer_procs": 2, "mesh.trainer_hosts": 2, "slurm.nodes": 3, "slurm.partition": "multi"}


def three_nodes(logs: str):
    """2 trainer procs on fnode1 and fnode2, the generator and the reward procs on fnode3."""
    config = Config().updated(
        {**SHAPE, "mesh.kind": "slurm", "slurm.log_dir": logs, "slurm.exclusive": False, "engine.name": "torch"}
    )
    return Session.up(config, prompts_per_step=4, group_size=4, threads_per_proc=1)


def uts_hostname(pid: int) -> str:
    """The host name process `pid` sees (its UTS namespace's: the Slurm node it runs on)."""
    out = subprocess.run(["nsenter", "--uts", "-t", str(pid), "hostname"], capture_output=True, text=True)
    return out.stdout.strip()


def assert_nothing_left(slurm) -> None:
    """No job, no job step, no proc on any node, no process of ours but the Slurm daemons."""
    assert slurm.wait_no_jobs() == []
    assert slurm.live_steps() == []
    # the job's srun on the first node outlives the cancel when a node was lost: it waits ~30 s on that node's step
    assert slurm.procs_on_nodes(timeout=60) == {n: [] for n in slurm.nodes}
    assert wait_no_children(exclude=slurm.daemons) == []


def test_sinfo_shows_three_nodes_each_its_own_host(slurm):
    out = subprocess.run(["sinfo", "-h", "-N", "-p", "multi", "-o", "%N %T"], capture_output=True, text=True)
    assert out.stdout.split() == ["fnode1", "idle", "fnode2", "idle", "fnode3", "idle"]
    hosts = subprocess.run(
        ["srun", "-N3", "-p", "multi", "sh", "-c", "echo $(hostname) $(hostname -I)"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    seen = {line.split()[0]: line.split()[1:] for line in hosts.stdout.splitlines()}
    assert {n: a[0] for n, a in seen.items() if n != "fnode1"} == {n: slurm.host(n).ip for n in ("fnode2", "fnode3")}
    assert slurm.addresses[0] in seen["fnode1"]  # this machine's own network, at the bridge's address


def test_forge_up_slurm_three_nodes_trainer_gang_over_two_generator_on_the_third(slurm, tmp_path):
    """In a real kernel, as a researcher would: a local session first (a session's server is its own process:
    the kernel runs no Monarch of its own), then `%forge up --slurm` with three nodes, steps, the kernel restarted
    (the job goes on), `%forge attach`, a step, `%forge down`."""
    k = Kernel()
    try:
        k.ok("%load_ext forge_nb")
        k.ok("import json, subprocess; from forge_nb.runtime import lifecycle")
        k.ok("%forge up prompts_per_step=4 group_size=4 threads_per_proc=1 --name local-first")
        k.ok("%forge down")
        k.ok(
            f"%forge up --slurm slurm.nodes=3 slurm.partition=multi slurm.exclusive=false slurm.log_dir={tmp_path} "
            "trainer_procs=2 mesh.trainer_hosts=2 prompts_per_step=4 group_size=4 threads_per_proc=1",
            timeout=300,
        )
        k.ok("s = lifecycle.current()")
        status = k.json("s.status()")
        assert status["hosts"]["trainer"] == ["fnode1", "fnode2"]
        assert status["hosts"]["generator"] == ["fnode3"] and status["hosts"]["reward"] == ["fnode3"]
        # Each proc runs on the node the plan names: the host name its own process sees (its UTS namespace).
        seen = {(r["role"], r["host"], uts_hostname(r["pid"])) for r in status["placement"]}
        assert all(planned == real for _, planned, real in seen), seen
        assert {(role, host) for role, host, _ in seen} >= {("trainer", "fnode1"), ("trainer", "fnode2")}
        # The trainer's and the generator's procs forked from their node's worker's fork server (its first
        # proc started it, in the job step); the reward worker started fresh.
        assert forked_roles(status) == {"trainer": True, "generator": True, "reward": False}
        assert k.json("s.step(2)['policy_version'].tolist()") == [1, 2]
        sums = k.json("s.checksums()")
        # The generator on fnode3 serves what both trainer ranks hold, put together from their shards.
        assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == 2
        assert "tcp" in k.json("s.status()['weights_transport']")
        assert slurm.jobs() == [status["slurm_job"]]
        k.restart()  # the session's server owns the job: it is not cancelled
        time.sleep(2)
        assert slurm.jobs() == [status["slurm_job"]]
        k.ok("%load_ext forge_nb")
        assert "attached to session" in k.ok("%forge attach")
        k.ok("from forge_nb.runtime import lifecycle; s = lifecycle.current()")
        assert k.json("[int(v) for v in s.step(1)['policy_version']]") == [3]
        assert k.json("s.checksums()")["generator"][0] == 3
        k.ok("%forge down", timeout=120)
        assert slurm.wait_no_jobs() == []  # cancelled (it leaves the queue once its steps have ended)
    finally:
        k.run("%forge down")
        k.stop()
    assert_nothing_left(slurm)


def lose_a_node(logs: str, netns: str) -> dict:
    s = three_nodes(logs)
    try:
        s.step(1)
        job = s.status()["slurm_job"]
        netns_hosts.kill_inside(netns)  # fnode2's slurmd, its job step and the trainer's rank 1: the node is gone
        start = time.monotonic()
        try:
            s.step(1)
            raised = None
        except HostLost as e:
            raised = str(e)
        seconds = time.monotonic() - start
        queued = queued_jobs()
    finally:
        s.down()
    return {"job": job, "raised": raised, "seconds": seconds, "queued": queued}


def test_a_node_lost_mid_run_is_named_and_down_cancels_the_job(slurm, tmp_path):
    try:
        got = in_fresh_process(lose_a_node, str(tmp_path / "logs"), slurm.host("fnode2").netns)
        assert got["raised"] is not None, "the step after the node was lost did not raise HostLost"
        said = got["raised"]
        # fnode2 is named first once Slurm finds it not responding (SlurmdTimeout=10 here); before that, every
        # node whose worker stopped answering (the job step that runs them all ended with fnode2's) is named.
        assert said.startswith("lost: node fnode") and "node fnode2 (Slurm's state: " in said, said
        assert re.search(r"fnode2 \(Slurm's state: [^;]+; its worker at [\d.:]+ does not answer\) held trainer", said)
        assert "start again from the last checkpoint" in said
        assert got["queued"] == [got["job"]]  # until down cancels it
        print(f"HostLost after {got['seconds']:.1f} s: {got['raised']}")
    finally:
        slurm.restore_node("fnode2")
    assert_nothing_left(slurm)


def test_exported_sbatch_for_three_nodes_runs_two_steps_there(slurm, tmp_path):
    config = Config().updated({**SHAPE, "mesh.kind": "slurm", "prompts_per_step": 4, "group_size": 4})
    config = config.updated({"threads_per_proc": 1, "engine.name": "torch"})
    out = export_config(config, tmp_path / "bundle", steps=2)
    script = (out / "run.sbatch").read_text()
    assert "#SBATCH --nodes=3" in script and "forge_nb.launch.worker" in script
    state = slurm.run_batch(out / "run.sbatch", timeout=400)
    log = next(out.glob("run_*.out")).read_text()
    assert "JobState=COMPLETED" in state and "ExitCode=0:0" in state, log[-3000:]
    result = json.loads((out / "result.json").read_text())
    assert result["steps"] == 2 and result["policy_version"] == 2
    assert result["config"]["mesh"]["kind"] == "hosts" and len(result["config"]["mesh"]["hosts"]) == 3
    assert_nothing_left(slurm)


def local_then_three_nodes(logs: str) -> str:
    Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, engine="torch").down()
    try:
        three_nodes(logs).down()
    except SessionError as e:
        return str(e)
    return "no error"


def test_a_kernel_that_ran_a_local_session_first_is_told_to_restart_for_several_nodes(slurm, tmp_path):
    said = in_fresh_process(local_then_three_nodes, str(tmp_path / "logs"))
    assert "the job's node(s) fnode2, fnode3 cannot reach this kernel: Monarch already runs here over Unix" in said
    assert "Restart the kernel and start the Slurm session before any local one" in said and "was cancelled" in said
    assert_nothing_left(slurm)
