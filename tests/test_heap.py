"""The start-up heap is frozen while a session is up and thawed when the last one goes down."""

import gc

from forge_nb import heap


def test_the_heap_thaws_when_the_last_session_goes_down(monkeypatch):
    monkeypatch.setattr(heap, "_holders", set())  # no session of another test counts here
    gc.unfreeze()
    first, second = object(), object()  # a second session in the same kernel: a fork, a comparison
    heap.hold(first)
    heap.hold(second)
    assert gc.get_freeze_count() > 0
    heap.release(first)
    heap.release(first)  # down twice: the second is nothing
    assert gc.get_freeze_count() > 0  # one session still up
    heap.release(second)
    assert gc.get_freeze_count() == 0
