"""A forge_nb session whose actors run inside a job of a real local Slurm (22.05, started here), on one node.

The sessions run in a fresh process (`tests.fresh`): a Slurm session makes Monarch listen on TCP in its
process, for good, which later local meshes of a test worker must not inherit."""

from __future__ import annotations

import pytest

from forge_nb.runtime.calls import wait
from forge_nb.session import Session, SessionError
from tests.conftest import wait_no_children
from tests.fleet.probe import EnvProbe
from tests.fresh import in_fresh_process
from tests.slurm_cluster import queued_jobs

pytestmark = pytest.mark.slow


def slurm_session(logs, **overrides):
    return Session.up(
        mesh={"kind": "slurm"},
        slurm={"log_dir": str(logs), "exclusive": False, "start_timeout_s": 60, **overrides},
        prompts_per_step=4,
        group_size=4,
        threads_per_proc=1,
        engine="torch",
    )


def assert_nothing_left(slurm) -> None:
    """No job in the queue, no job step running, no process of ours but the Slurm daemons."""
    assert slurm.wait_no_jobs() == []
    assert slurm.live_steps() == []
    assert wait_no_children(exclude=slurm.daemons) == []


def steps_inside_the_job(logs: str) -> dict:
    s = slurm_session(logs)
    try:
        job = s.status()["slurm_job"]
        queued = queued_jobs()
        seen = {}
        for role in ("generator", "trainer", "reward"):
            probe = s.fleet.mesh.proc_meshes[role].spawn("probe", EnvProbe)
            seen[role] = set(wait(probe.env.call("SLURM_JOB_ID")).values())
        steps = len(s.step(2))
        return {"job": job, "queued": queued, "seen": seen, "steps": steps, "sums": s.checksums()}
    finally:
        s.down()


def test_actors_run_inside_the_job_step_sync_and_down_cancels_it(slurm, tmp_path):
    got = in_fresh_process(steps_inside_the_job, str(tmp_path / "logs"))
    assert got["job"] and got["queued"] == [got["job"]]
    assert got["seen"] == {role: {got["job"]} for role in ("generator", "trainer", "reward")}
    assert got["steps"] == 2
    sums = got["sums"]
    assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == 2
    assert_nothing_left(slurm)


def keep_then_attach(logs: str) -> dict:
    first = slurm_session(logs, keep_job=True)
    job = first.status()["slurm_job"]
    first.down()
    kept = queued_jobs()
    second = slurm_session(logs, job_id=job)
    try:
        return {"job": job, "kept": kept, "attached": second.status()["slurm_job"], "steps": len(second.step(1))}
    finally:
        second.down()


def test_keep_job_then_attach_by_job_id(slurm, tmp_path):
    got = in_fresh_process(keep_then_attach, str(tmp_path / "logs"))
    assert got["kept"] == [got["job"]] and got["attached"] == got["job"] and got["steps"] == 1
    assert_nothing_left(slurm)


def test_unknown_partition_is_a_clear_error_and_leaves_no_job(slurm, tmp_path):
    with pytest.raises(
        SessionError,
        match=r"sbatch refused the forge_nb job: invalid partition specified: nope; .*partitions here: debug, small",
    ):
        slurm_session(tmp_path / "logs", partition="nope")
    assert slurm.jobs() == []


def test_job_pending_past_the_timeout_is_cancelled_with_its_reason(slurm, tmp_path):
    with pytest.raises(SessionError, match=r"still pending after 3 s \(reason: BeginTime\); it was cancelled"):
        slurm_session(tmp_path / "logs", sbatch_args=["--begin=now+3600"], start_timeout_s=3)
    assert slurm.wait_no_jobs() == []


def test_no_slurm_tools_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    with pytest.raises(SessionError, match=r"sbatch, squeue, scancel, scontrol not found: .*Slurm's client tools"):
        Session.up(mesh={"kind": "slurm"}, engine="torch")
