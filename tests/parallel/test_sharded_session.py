"""A session whose trainer is a gang of 2 procs (FSDP2 on gloo) on a real local mesh: it takes the one-proc
steps, saves checkpoints that resume at 1 or 2 procs bit for bit, and restarts the gang when a rank dies
or hangs (tests/parallel/test_gang_session.py: placement, live losses, the sharded reference)."""

import os
import signal
import time

import psutil
import pytest

import forge_nb
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}
# One micro-batch for the whole batch: rank 0 runs it and rank 1 a zero-gradient filler, so 1 and 2 procs do
# the same arithmetic and must agree bit for bit (tests/parallel/test_policy.py splits the rows over the ranks).
ONE_FORWARD = {"micro_batch_tokens": 1 << 20}


def _run(procs: int, steps: int = 3, **more):
    s = forge_nb.up(trainer_procs=procs, **SMALL, **more)
    try:
        rows = s.step(steps)[["loss", "grad_norm", "mean_reward", "policy_version"]]
        return rows, s.checksums()
    finally:
        s.down()


def _same_rows(a, b) -> None:
    """Step rows of two runs: the same losses, rewards and versions; the gradient norm (float64, a sum of
    squares over shards in another order) to 1e-12 -- the clipping scale it gives is the same float32."""
    assert a.drop(columns="grad_norm").equals(b.drop(columns="grad_norm"))
    assert a["grad_norm"].to_numpy() == pytest.approx(b["grad_norm"].to_numpy(), rel=1e-12)


def test_three_steps_at_two_procs_equal_one_proc():
    one_rows, one_sums = _run(1, **ONE_FORWARD)
    two_rows, two_sums = _run(2, **ONE_FORWARD)
    _same_rows(two_rows, one_rows)
    assert two_sums["trainer"] == one_sums["trainer"] == two_sums["generator"]  # every weight, bit for bit
    assert wait_no_children() == []


def test_a_checkpoint_at_two_procs_resumes_at_one_and_two_bit_for_bit(tmp_path):
    s = forge_nb.up(trainer_procs=2, **SMALL, **ONE_FORWARD)
    try:
        s.step(2)
        saved = s.checksums()["trainer"]
        s.save(tmp_path / "ck")
        s.step(2)
        after = s.checksums()
    finally:
        s.down()
    assert len(list((tmp_path / "ck" / "trainer" / "sharded").glob("*.distcp"))) == 2  # a file per rank
    for procs in (1, 2):
        r = forge_nb.resume(tmp_path / "ck", trainer_procs=procs)
        try:
            assert r.checksums()["trainer"] == saved
            r.step(2)
            assert r.checksums() == after, procs
        finally:
            r.down()
    assert wait_no_children() == []


def _wait_until(predicate, timeout: float = 180.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


def _restored(s) -> str:
    events = [e for e in s.status()["events"] if e["role"] == "trainer"]
    assert events and "restored" in events[-1]["what"], events
    return events[-1]["what"]


def test_a_rank_killed_mid_run_restarts_the_gang_from_the_last_checkpoint(tmp_path):
    checkpoint = {"every": 1, "dir": str(tmp_path), "on_trainer_failure": "restore"}
    s = forge_nb.up(trainer_procs=2, checkpoint=checkpoint, collective_timeout_s=5.0, **SMALL)
    try:
        run = s.run(steps=4)
        _wait_until(lambda: run.done >= 2)
        ranks = s.pids["trainer"]
        os.kill(ranks[1], signal.SIGKILL)  # in a step, a refresh or a periodic checkpoint: each restores
        run.wait(300)
        assert run.state == "finished", run.error
        assert s.step_count == 4 and s.pids["trainer"] != ranks
        _restored(s)
        sums = s.checksums()
        assert sums["trainer"] == sums["generator"]  # the generator serves whole versions only
    finally:
        s.down()
    assert wait_no_children() == []


def test_a_rank_that_hangs_in_a_save_restarts_the_gang_and_the_save_says_so(tmp_path):
    """SIGSTOP on rank 1, then a save: rank 0's collective times out (GangError), the gang restarts from
    the last checkpoint, and the save raises instead of writing a checkpoint of the state that died."""
    from forge_nb.mesh.recovery import CheckpointLost

    checkpoint = {"every": 1, "dir": str(tmp_path / "periodic"), "on_trainer_failure": "restore"}
    s = forge_nb.up(trainer_procs=2, checkpoint=checkpoint, collective_timeout_s=5.0, **SMALL)
    ranks = s.pids["trainer"]
    try:
        s.step(1)
        os.kill(ranks[1], signal.SIGSTOP)
        with pytest.raises(CheckpointLost, match="the trainer died while saving"):
            s.save(tmp_path / "mine")
        assert not list(tmp_path.glob("*mine*"))  # no checkpoint, no half-written folder
        assert "step-00000001" in _restored(s) and s.pids["trainer"] != ranks
        s.step(1)
        sums = s.checksums()
        assert sums["trainer"] == sums["generator"] and s.step_count == 2
    finally:
        s.down()
        for pid in ranks:
            if psutil.pid_exists(pid):
                os.kill(pid, signal.SIGKILL)
    assert wait_no_children() == []


@pytest.mark.slow
def test_smollm2_at_two_procs_takes_the_one_proc_steps(tmp_path):
    """The real SmolLM2-135M-Instruct (tied embeddings, chat prompts): 3 steps at 2 procs equal 1 proc's,
    every weight bit for bit, and the generator serves them."""
    from tests.test_real_model import write_dataset

    write_dataset(tmp_path / "sums.jsonl")
    real = {
        "model": "smollm2-135m-instruct",
        "task": str(tmp_path / "sums.jsonl"),
        "prompt_column": "messages",
        "prompts_per_step": 2,
        "group_size": 4,
        "max_tokens": 8,
        "lr": 1e-5,
        "threads_per_proc": 1,
        **ONE_FORWARD,
    }
    results = {}
    for procs in (1, 2):
        s = forge_nb.up(trainer_procs=procs, **real)
        try:
            results[procs] = (s.step(3)[["loss", "grad_norm", "mean_reward"]], s.checksums())
        finally:
            s.down()
    _same_rows(results[2][0], results[1][0])
    assert results[2][1]["trainer"] == results[1][1]["trainer"] == results[2][1]["generator"]
    assert wait_no_children() == []
