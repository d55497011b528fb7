"""A forge_nb session whose actors run inside a job of a real local Slurm (22.05, started here)."""

from __future__ import annotations

import pytest

import forge_nb
from forge_nb.mesh.calls import wait
from forge_nb.session import SessionError
from tests.conftest import wait_no_children
from tests.mesh.probe import EnvProbe

pytestmark = pytest.mark.slow


def slurm_session(slurm, tmp_path, **overrides):
    return forge_nb.up(
        mesh={"kind": "slurm"},
        slurm={"log_dir": str(tmp_path / "logs"), "exclusive": False, "start_timeout_s": 60, **overrides},
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


def test_actors_run_inside_the_job_step_sync_and_down_cancels_it(slurm, tmp_path):
    s = slurm_session(slurm, tmp_path)
    try:
        job = s.status()["slurm_job"]
        assert job and slurm.jobs() == [job]
        for role in ("generator", "trainer", "reward"):
            probe = s.actors.mesh.proc_meshes[role].spawn("probe", EnvProbe)
            assert set(wait(probe.env.call("SLURM_JOB_ID")).values()) == {job}
        df = s.step(2)
        assert len(df) == 2
        sums = s.checksums()
        assert sums["generator"] == sums["trainer"] and sums["trainer"][0] == 2
    finally:
        s.down()
    assert_nothing_left(slurm)


def test_keep_job_then_attach_by_job_id(slurm, tmp_path):
    first = slurm_session(slurm, tmp_path, keep_job=True)
    job = first.status()["slurm_job"]
    first.down()
    assert slurm.jobs() == [job]  # kept
    second = slurm_session(slurm, tmp_path, job_id=job)
    try:
        assert second.status()["slurm_job"] == job
        assert len(second.step(1)) == 1
    finally:
        second.down()
    assert_nothing_left(slurm)


def test_unknown_partition_is_a_clear_error_and_leaves_no_job(slurm, tmp_path):
    with pytest.raises(
        SessionError,
        match=r"sbatch refused the forge_nb job: invalid partition specified: nope; .*partitions here: debug, small",
    ):
        slurm_session(slurm, tmp_path, partition="nope")
    assert slurm.jobs() == []


def test_job_pending_past_the_timeout_is_cancelled_with_its_reason(slurm, tmp_path):
    with pytest.raises(SessionError, match=r"still pending after 3 s \(reason: BeginTime\); it was cancelled"):
        slurm_session(slurm, tmp_path, sbatch_args=["--begin=now+3600"], start_timeout_s=3)
    assert slurm.wait_no_jobs() == []


def test_no_slurm_tools_is_a_clear_error(monkeypatch, tmp_path):
    monkeypatch.setenv("PATH", str(tmp_path))  # no sbatch here
    with pytest.raises(SessionError, match=r"sbatch, squeue, scancel, scontrol not found: .*Slurm's client tools"):
        forge_nb.up(mesh={"kind": "slurm"}, engine="torch")
