"""Save, resume and fork a session on a real mesh; a trainer that dies is restored or named clearly."""

import os
import signal

import pytest

import forge_nb
from forge_nb.fleet.recovery import TrainerLost
from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}
ROWS = [{"q": f"{a}+{b}=", "a": str(a + b), "bonus": a % 2} for a in range(10, 40) for b in (3, 7)]


def odd(prompt, completion, target, bonus):
    return float(bonus)


def _weights(s) -> tuple:
    sums = s.checksums()
    return sums["trainer"], sums["generator"]


def test_train_save_train_equals_resume_train_bit_for_bit(tmp_path):
    s = Session.up(task=ROWS, prompt_column="q", answer_column="a", **SMALL)
    try:
        s.set_reward(odd, name="bonus", weight=0.5)
        s.step(2)
        s.save(tmp_path / "ck")
        s.step(3)
        a, a_rows = _weights(s), s.metrics_stream.to_pandas("step")[["mean_reward", "loss", "policy_version"]]
        a_ids = [e.sample_id for e in s.state.buffer.recent(1000)]
    finally:
        s.down()
    r = Session.restore(tmp_path / "ck")
    try:
        assert r.step_count == 2 and r.trainer_version == 2 and r.config.task.name == "dataset"
        assert set(r.registry.live("reward").members) == {"reward", "bonus"}
        assert r.state.task.epoch == 0 and len(r.state.task.held_out) == 6
        r.step(3)
        b, b_rows = _weights(r), r.metrics_stream.to_pandas("step")[["mean_reward", "loss", "policy_version"]]
        assert a == b  # trainer and generator weights, bit for bit
        assert a_rows.equals(b_rows)  # the metrics before the save came along; those after are the same
        assert [e.sample_id for e in r.state.buffer.recent(1000)] == a_ids
    finally:
        r.down()
    assert wait_no_children() == []


def test_a_checkpoint_between_train_and_sync_keeps_the_generator_one_version_behind(tmp_path):
    s = Session.up(**SMALL)
    try:
        s.step(1)
        s.train(s.rollout())  # trained, not synced
        before = _weights(s)
        s.save(tmp_path / "ck")
    finally:
        s.down()
    assert (tmp_path / "ck" / "generator" / "model.safetensors").is_file()
    r = Session.restore(tmp_path / "ck")
    try:
        assert (r.trainer_version, r.generator_version) == (2, 1) and _weights(r) == before
        assert r.sync()["version"] == 2
    finally:
        r.down()
    assert wait_no_children() == []


def test_periodic_checkpoints_are_pruned_and_fork_starts_from_one(tmp_path):
    s = Session.up(checkpoint={"every": 2, "keep": 2, "dir": str(tmp_path)}, **SMALL)
    forked = None
    try:
        s.step(6)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["step-00000004", "step-00000006"]
        forked = s.fork(5)
        assert forked.step_count == 4 and forked.trainer_version == 4 and s.step_count == 6
        assert forked.step(1).index[-1] == 5 and s.is_up  # both sessions up in one process
        with pytest.raises(forge_nb.session.SessionError, match=r"no checkpoint at or before step 3 .*\[4, 6\]"):
            s.fork(3)
    finally:
        if forked is not None:
            forked.down()
        s.down()
    assert wait_no_children() == []


def test_a_dead_trainer_is_restored_from_the_last_checkpoint_when_configured(tmp_path):
    s = Session.up(checkpoint={"every": 2, "dir": str(tmp_path), "on_trainer_failure": "restore"}, **SMALL)
    try:
        s.step(3)
        os.kill(s.pids["trainer"][0], signal.SIGKILL)
        row = s.step(1).iloc[-1]
        assert row.policy_version == 3  # checkpoint at step 2 (policy v2), then this step
        events = [e for e in s.status()["events"] if e["role"] == "trainer"]
        assert events and "restored v2 from" in events[-1]["what"]
        assert _weights(s)[0] == _weights(s)[1]
    finally:
        s.down()
    assert wait_no_children() == []


def test_a_dead_trainer_without_a_checkpoint_stops_with_a_clear_error():
    s = Session.up(**SMALL)
    try:
        s.step(1)
        os.kill(s.pids["trainer"][0], signal.SIGKILL)
        with pytest.raises(
            TrainerLost,
            match=r"trainer's proc died \(.*Killed\(sig=9\)\) .*policy version 1; start "
            r"again from a checkpoint: forge_nb.resume\(path\)",
        ):
            s.step(1)
    finally:
        s.down()
    assert wait_no_children() == []
