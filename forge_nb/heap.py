"""The start-up heap kept out of Python's full garbage collections, in the kernel and in every proc.

After torch, transformers, pandas and Monarch are imported a process tracks ~480k objects, and a full
(generation 2) collection walks all of them: 200-220 ms in the kernel, measured, every few hundred
steps, in the middle of one (a step on the bundled model takes ~45 ms). Objects alive once a session has
started are frozen (`gc.freeze`, as vLLM's engine does after start-up), so a full collection walks only
what came after. Frozen objects that later become garbage in a cycle are freed only when the heap is
thawed: in the kernel when its last session goes down (`release`); a proc's heap stays frozen until the
proc exits.
"""

from __future__ import annotations

import atexit
import gc
import threading

_lock = threading.Lock()
_holders: set[int] = set()  # ids of the sessions up in this process that froze the heap

# The interpreter's last collection skips frozen objects: extension modules that count their objects at exit
# (triton's nanobind bindings, imported with torch) would print hundreds of "leaked" lines. Thawing a heap
# that is not frozen does nothing.
atexit.register(gc.unfreeze)


def freeze() -> None:
    """Collect what is garbage now, then freeze every object alive (thawed again when the process exits)."""
    gc.collect()
    gc.freeze()


def hold(session: object) -> None:
    """`session` came up in this process: freeze the heap (again: objects made since are frozen too)."""
    with _lock:
        _holders.add(id(session))
        freeze()


def release(session: object) -> None:
    """`session` went down (again: nothing happens): when it was the last one up, thaw the heap so that
    collections see it again."""
    with _lock:
        if id(session) not in _holders:
            return
        _holders.discard(id(session))
        if not _holders:
            gc.unfreeze()
