"""A live-code deadline counts the code's own seconds: not those its thread waits for a CPU that other
processes hold (a loaded 2-core machine), while code that sleeps or spins for ever still times out."""

import multiprocessing
import os
import threading
import time

import pytest

from forge_nb.live.deadline import run_queue_s, start_thread, wait_for

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat")


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds  # CPU seconds of this thread: the same work however loaded
    while time.thread_time() < end:
        pass


def _hog(cpu: int) -> None:
    os.sched_setaffinity(0, {cpu})
    while True:
        pass


@pytest.fixture
def one_busy_cpu():
    """This process on one CPU that three spinning processes share with it; restored after."""
    cpu, before = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    hogs = [multiprocessing.get_context("spawn").Process(target=_hog, args=(cpu,), daemon=True) for _ in range(3)]
    for h in hogs:
        h.start()
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for h in hogs:
            h.kill()
            h.join()


def _run(fn, budget: float) -> tuple[bool, float, float]:
    """Run `fn` under a `budget` s deadline -> (finished, wall s, run-queue s of its thread)."""
    done, queued = threading.Event(), []

    def target() -> None:
        fn()
        queued.append(run_queue_s(threading.get_native_id()))
        done.set()

    start = time.monotonic()
    finished = wait_for(done, budget, start_thread(target, "test-deadline"))
    return finished, time.monotonic() - start, queued[0] if queued else 0.0


def test_code_that_waits_for_a_cpu_held_by_other_processes_is_not_timed_out(one_busy_cpu):
    time.sleep(0.5)  # the hogs are spinning
    finished, wall, queued = _run(lambda: spin(0.3), budget=0.6)
    assert finished, f"timed out after {wall:.2f} s wall, {queued:.2f} s of it waiting for the CPU"
    assert queued > 0  # it did wait: the excuse was needed, not the budget alone


def test_code_that_sleeps_or_spins_for_ever_still_times_out():
    assert _run(lambda: time.sleep(60), budget=0.3)[0] is False
    assert _run(lambda: spin(60), budget=0.3)[0] is False
