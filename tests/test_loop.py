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


def test_a_loss_failing_after_a_batchs_first_step_counts_the_step_it_finished():
    from forge_nb.actors.trainer import LossFailedAfterSteps

    calls = []

    def step():
        calls.append(1)
        if len(calls) == 2:  # the batch's first optimizer steps were taken, the step finished, then it raised
            raise LossFailedAfterSteps("loss v1 failed on step 2 of the batch's 2", {"updates": 1})

    run = BackgroundRun(step, steps=None).start()
    run.wait(5)
    assert run.state == "failed" and run.done == 2 and "step 2 failed: LossFailedAfterSteps" in run.error


class _Driver:
    """A stand-in session for the run slot's own logic (the real one is tested on a mesh)."""

    def sync_step(self):
        return None


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
