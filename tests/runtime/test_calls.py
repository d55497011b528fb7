import time

import pytest

from forge_nb.runtime.calls import shards


def test_shards_are_contiguous_nearly_equal_and_never_empty():
    assert shards(10, 3) == [slice(0, 4), slice(4, 8), slice(8, 12)]
    assert shards(2, 4) == [slice(0, 1), slice(1, 2)]
    assert shards(5, 1) == [slice(0, 5)]
    items = list(range(10))
    assert [x for part in shards(10, 3) for x in items[part]] == items


class _Pending:
    """A future that answers after `slices` timed-out waits (a Monarch future may be waited on again)."""

    def __init__(self, slices: int) -> None:
        self.slices, self.waits = slices, []

    def get(self, timeout=None):
        self.waits.append(timeout)
        if len(self.waits) <= self.slices:
            raise TimeoutError
        return "answer"


def test_a_wait_runs_the_watchers_between_slices_and_raises_what_one_reports(monkeypatch):
    from forge_nb.runtime import calls

    monkeypatch.setattr(calls, "WATCH_EVERY_S", 0.01)
    future = _Pending(slices=0)
    assert calls.wait(future) == "answer" and future.waits == [None]  # no watcher: one plain get()
    seen = []

    def check():
        seen.append(1)
        return RuntimeError("host h2 is gone") if len(seen) == 2 else None

    calls.watch(check)
    try:
        with pytest.raises(RuntimeError, match="host h2 is gone"):
            calls.wait(_Pending(slices=10))
        assert calls.wait(_Pending(slices=0)) == "answer"
        with pytest.raises(TimeoutError):
            calls.wait(_Pending(slices=10**6), timeout=0.05)
    finally:
        calls.unwatch(check)
    assert calls._watchers == []


class _Answers:
    """A rank's future: answers `value` (raises it when an exception) once `ready`, else a wait with a timeout
    times out (after at most 1 ms) and one without blocks until it is ready: never, for `ready=False`."""

    def __init__(self, ready: bool | int = True, value="answer") -> None:
        self.ready, self.value, self.waits = ready, value, 0  # an int: ready after that many waits

    def get(self, timeout=None):
        self.waits += 1
        blocks = timeout is None and self.ready is not False  # a wait without a timeout: until it answers
        if blocks or self.ready is True or (self.ready is not False and self.waits > self.ready):
            if isinstance(self.value, BaseException):
                raise self.value
            return self.value
        if timeout is None:
            raise AssertionError("waited without a timeout on a rank that never answers")
        time.sleep(min(timeout, 0.001))
        raise TimeoutError


def test_a_gang_call_answers_in_rank_order_and_raises_a_ranks_failure_while_another_hangs():
    from forge_nb.runtime.calls import GangFuture

    assert GangFuture([_Answers(3, "r0"), _Answers(True, "r1"), _Answers(1, "r2")]).get() == ["r0", "r1", "r2"]
    hung, failing = _Answers(False), _Answers(2, RuntimeError("rank 1: gloo timed out"))
    with pytest.raises(RuntimeError, match="rank 1: gloo timed out"):
        GangFuture([hung, failing]).get()
    assert hung.waits == 3  # took turns with the failing rank instead of waiting on rank 0 alone


def test_a_gang_call_times_out_keeping_its_answers_and_names_the_rank_that_hung_after_its_peers(monkeypatch):
    from forge_nb.parallel.gang import GangError
    from forge_nb.runtime.calls import GangFuture

    monkeypatch.setattr(GangFuture, "POLL_S", 0.001)
    first, second = _Answers(True, "r0"), _Answers(False, "r1")
    gang = GangFuture([first, second])
    with pytest.raises(TimeoutError):
        gang.get(timeout=0.0)  # polls each rank once
    assert first.waits == 1
    second.ready = True
    assert gang.get() == ["r0", "r1"] and first.waits == 1  # waited on again: rank 0's answer was kept
    gang = GangFuture([_Answers(False), _Answers(True, "r1"), _Answers(False)], "train_step", 0.05)
    with pytest.raises(GangError, match="rank 0, 2 gave no answer to train_step 0.05 s after rank 1 did"):
        gang.get()
    with pytest.raises(TimeoutError):  # no straggler rule before any rank answered: the plain timeout
        GangFuture([_Answers(False), _Answers(False)], "train_step", 0.01).get(timeout=0.05)
