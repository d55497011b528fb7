"""A live-code deadline counts the code's own seconds: not those its thread waits for a CPU that other
processes hold (a loaded 2-core machine), while code that sleeps or spins for ever still times out."""

import os
import subprocess
import sys
import threading
import time

import pytest

from forge_nb.live.deadline import run_queue_s, start_thread, wait_for
from tests.conftest import wait_no_children

pytestmark = pytest.mark.skipif(not os.path.exists("/proc/thread-self/schedstat"), reason="Linux schedstat")


def spin(seconds: float) -> None:
    end = time.thread_time() + seconds  # CPU seconds of this thread: the same work however loaded
    while time.thread_time() < end:
        pass


HOG = "import os, sys\nos.sched_setaffinity(0, {int(sys.argv[1])})\nwhile True:\n    pass"


@pytest.fixture
def one_busy_cpu():
    """This process on one CPU that three spinning processes share with it; restored after. (Plain
    subprocesses: multiprocessing's spawn would also start its resource tracker, a child of this process that
    outlives the test and fails the next module's no-process-left check.)"""
    cpu, before = min(os.sched_getaffinity(0)), os.sched_getaffinity(0)
    hogs = [subprocess.Popen([sys.executable, "-c", HOG, str(cpu)]) for _ in range(3)]
    os.sched_setaffinity(0, {cpu})
    try:
        yield
    finally:
        os.sched_setaffinity(0, before)
        for h in hogs:
            h.kill()
            h.wait()
    assert wait_no_children() == []


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
