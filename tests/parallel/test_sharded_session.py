"""A session whose trainer is a gang of 2 procs (FSDP2 on gloo) on a real local mesh: it takes the one-proc
steps, saves checkpoints that resume at 1 or 2 procs bit for bit, and restarts the gang when a rank dies
or hangs (tests/parallel/test_gang_session.py: placement, live losses, the sharded reference)."""

import os
import signal
import time

import pandas as pd
import psutil
import pytest

from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}
# One micro-batch for the whole batch: rank 0 runs it and rank 1 a zero-gradient filler, so 1 and 2 procs do
# the same arithmetic and must agree bit for bit (tests/parallel/test_policy.py splits the rows over the ranks).
ONE_FORWARD = {"micro_batch_tokens": 1 << 20}


def _same_rows(a, b) -> None:
    """Step rows of two runs: the same losses, rewards and versions; the gradient norm (float64, a sum of
    squares over shards in another order) to 1e-12 -- the clipping scale it gives is the same float32."""
    assert a.drop(columns="grad_norm").equals(b.drop(columns="grad_norm"))
    assert a["grad_norm"].to_numpy() == pytest.approx(b["grad_norm"].to_numpy(), rel=1e-12)


ROWS = ["loss", "grad_norm", "mean_reward", "policy_version"]


def test_two_procs_take_the_one_proc_steps_and_a_checkpoint_resumes_at_one_and_two_bit_for_bit(tmp_path):
    """4 steps at 1 proc; 4 at 2 procs with a checkpoint after the second: the same rows and every weight
    bit for bit; the checkpoint (a shard file per rank) resumed at 1 and at 2 procs takes the same 2 steps."""
    one = Session.up(trainer_procs=1, **SMALL, **ONE_FORWARD)
    try:
        one_rows, one_sums = one.step(4)[ROWS], one.checksums()
    finally:
        one.down()
    s = Session.up(trainer_procs=2, **SMALL, **ONE_FORWARD)
    try:
        first = s.step(2)[ROWS]
        saved = s.checksums()["trainer"]
        s.save(tmp_path / "ck")
        two_rows, after = pd.concat([first, s.step(2)[ROWS]]), s.checksums()
    finally:
        s.down()
    _same_rows(two_rows, one_rows)
    assert after["trainer"] == one_sums["trainer"] == after["generator"]  # every weight, bit for bit
    assert len(list((tmp_path / "ck" / "trainer" / "sharded").glob("*.distcp"))) == 2  # a file per rank
    for procs in (1, 2):
        r = Session.restore(tmp_path / "ck", trainer_procs=procs)
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


def _kill(pids: list[int]) -> None:
    """SIGKILL those of `pids` (procs a test stopped) that still run."""
    for pid in pids:
        if psutil.pid_exists(pid):
            os.kill(pid, signal.SIGKILL)


def test_a_rank_killed_mid_run_restarts_the_gang_from_the_last_checkpoint(tmp_path):
    checkpoint = {"every": 1, "dir": str(tmp_path), "on_trainer_failure": "restore"}
    s = Session.up(trainer_procs=2, checkpoint=checkpoint, collective_timeout_s=5.0, **SMALL)
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


def test_a_rank_that_hangs_restarts_the_gang_on_its_peers_timeout_in_a_save_and_in_a_step(tmp_path):
    """SIGSTOP on rank 1, then a save: rank 0's collective times out (GangError), the gang restarts from
    the last checkpoint, and the save raises instead of writing a checkpoint of the state that died. Then
    SIGSTOP on rank 0 (the rank that answers for the gang), then a step: rank 1's collective times out, the
    gang restarts and the step is taken. Both times the cause is the peer's timeout: the session does not
    wait for the hung rank's answer (Monarch gives a hung proc up only after ~60 s)."""
    from forge_nb.fleet.recovery import CheckpointLost

    checkpoint = {"every": 1, "dir": str(tmp_path / "periodic"), "on_trainer_failure": "restore"}
    s = Session.up(trainer_procs=2, checkpoint=checkpoint, collective_timeout_s=5.0, **SMALL)
    stopped = []
    try:
        s.step(1)
        stopped.append(s.pids["trainer"][1])
        os.kill(stopped[-1], signal.SIGSTOP)
        with pytest.raises(CheckpointLost, match="the trainer died while saving .*GangError: trainer rank 0"):
            s.save(tmp_path / "mine")
        assert not list(tmp_path.glob("*mine*"))  # no checkpoint, no half-written folder
        assert "step-00000001" in _restored(s) and stopped[-1] not in s.pids["trainer"]
        s.step(1)
        stopped.append(s.pids["trainer"][0])
        os.kill(stopped[-1], signal.SIGSTOP)
        row = s.step(1).iloc[-1]
        # all rewards alike (the tiny model): the step runs no collective, only the straggler rule sees the hang
        assert row["policy_version"] == 3 and row["grad_norm"] == 0.0
        restored = _restored(s)
        assert "step-00000002" in restored and "gave no answer to train_batch" in restored, restored
        sums = s.checksums()
        assert sums["trainer"] == sums["generator"] and s.step_count == 3
    finally:
        s.down()
        _kill(stopped)
    assert wait_no_children() == []


def test_a_sharded_reference_rank_killed_or_hung_is_started_afresh_and_the_step_taken():
    """KL on: the reference is a gang of 2 procs beside the trainer's. A reference rank killed, then one
    stopped (SIGSTOP): each time its peer's collective fails, the reference gang is started afresh and the
    step is taken; the trainer is not touched."""
    s = Session.up(trainer_procs=2, kl_coef=0.05, collective_timeout_s=5.0, **SMALL)
    stopped, trainer = [], s.pids["trainer"]
    try:
        s.step(1)
        os.kill(s.pids["reference"][1], signal.SIGKILL)
        assert s.step(1).iloc[-1]["policy_version"] == 2
        stopped.append(s.pids["reference"][0])
        os.kill(stopped[-1], signal.SIGSTOP)
        assert s.step(1).iloc[-1]["policy_version"] == 3
        events = [e["what"] for e in s.status()["events"] if e["role"] == "reference"]
        assert len(events) == 2 and all("respawned" in e for e in events), events
        assert "GangError: reference rank 1" in events[1], events  # the stopped rank's peer timed out
        assert s.pids["trainer"] == trainer and stopped[-1] not in s.pids["reference"]
    finally:
        s.down()
        _kill(stopped)
    assert wait_no_children() == []


@pytest.mark.slow
def test_smollm2_at_two_procs_trains_and_serves_whole_versions(tmp_path):
    """The real SmolLM2-135M-Instruct (tied embeddings, chat prompts) at 2 procs: after each step the
    generator serves, put together from both ranks' shards, the trainer's weights bit for bit (that the 2
    ranks take the 1-rank steps: tests/parallel/test_policy.py, on the same model)."""
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
    }
    s = Session.up(trainer_procs=2, **real)
    try:
        for version in (1, 2):
            assert s.step(1).iloc[-1]["policy_version"] == version
            sums = s.checksums()
            assert sums["trainer"] == sums["generator"] == (version, sums["trainer"][1])
    finally:
        s.down()
    assert wait_no_children() == []
