import pytest

from forge_nb.mesh.calls import shards


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
    from forge_nb.mesh import calls

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
