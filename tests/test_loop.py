import threading
import time

import pytest

from forge_nb.loop import BackgroundRun


def test_runs_the_requested_steps_then_finishes():
    calls = []
    run = BackgroundRun(lambda: calls.append(1), steps=5).start()
    run.wait(5)
    assert run.state == "finished" and run.done == 5 and len(calls) == 5


def test_pause_resume_and_stop_take_effect_between_steps():
    gate = threading.Semaphore(0)
    run = BackgroundRun(lambda: gate.acquire(timeout=1), steps=None).start()
    gate.release()
    run.pause()
    gate.release()  # lets the step in flight finish
    time.sleep(0.1)
    paused_at = run.done
    time.sleep(0.2)
    assert run.state == "paused" and run.done == paused_at
    run.resume()
    gate.release()
    time.sleep(0.1)
    assert run.done > paused_at
    run.stop()
    assert run.state == "finished"


def test_an_exception_stops_the_run_and_is_kept():
    def step():
        raise ValueError("boom")

    run = BackgroundRun(step, steps=None).start()
    run.wait(5)
    assert run.state == "failed" and "step 1 failed: ValueError: boom" in run.error


class _Driver:
    """A stand-in session for the loop's own logic (the real one is tested on a mesh)."""

    def __init__(self) -> None:
        from forge_nb.metrics import MetricsStream

        self.metrics_stream, self.step_count, self.calls = MetricsStream(), 0, []
        self.trainer_version = self.generator_version = 0

    def rollout(self):
        from forge_nb.rl.rollout import Rollout

        self.calls.append("rollout")
        return Rollout([], self.generator_version, 0.5, 0.1, 0.01)

    def train(self, rollout):
        self.calls.append("train")
        self.trainer_version += 1
        self.step_count += 1
        return {"policy_version": self.trainer_version, "train_seconds": 0.2, "loss": 0.3, "grad_norm": 1.5}

    def sync(self):
        self.calls.append("sync")
        self.generator_version = self.trainer_version
        return {"version": self.generator_version, "total_seconds": 0.05, "gbps": 2.0}

    def after_step(self, row, rollout, train):
        self.calls.append("after")

    def whole_step(self):
        import contextlib

        self.calls.append("lock")
        return contextlib.nullcontext()


def test_a_sync_step_is_rollout_train_sync_under_both_locks_and_emits_one_row(monkeypatch):
    from forge_nb.loop import sync_step
    from forge_nb.rl.rollout import Rollout

    monkeypatch.setattr(Rollout, "mean_reward", property(lambda self: 0.25))
    driver = _Driver()
    row = sync_step(driver)
    assert driver.calls == ["lock", "rollout", "train", "sync", "after"]
    assert (row.step, row.mode, row.policy_version, row.generator_version, row.staleness) == (1, "sync", 1, 1, 0)
    assert (row.train_s, row.refresh_s, row.refresh_gbps, row.loss) == (0.2, 0.05, 2.0, 0.3)
    (emitted,) = driver.metrics_stream.rows("step")
    assert emitted == {"time": emitted["time"], "kind": "step", **row.as_dict()}


def test_run_slot_refuses_a_second_run_and_an_unknown_mode():
    from forge_nb.loop import RunError, RunSlot

    slot, gate = RunSlot(), threading.Event()
    slot.current = BackgroundRun(lambda: gate.wait(1), steps=None).start()
    with pytest.raises(RunError, match="already running"):
        slot.start(_Driver(), None, "sync", 1)
    slot.stop()
    gate.set()
    with pytest.raises(RunError, match="run mode must be 'sync' or 'async', got 'fast'"):
        slot.start(_Driver(), None, "fast", 1)
