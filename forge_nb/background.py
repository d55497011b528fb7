"""Background run: steps the session in a thread so the kernel stays responsive.

Pause, resume and stop take effect at step boundaries. An exception in a step stops the run and
is kept (`error`) for `status()` and the dashboard; it is never swallowed.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable


class BackgroundRun:
    """Calls `step()` until `steps` steps are done (None: until stopped)."""

    def __init__(self, step: Callable[[], object], steps: int | None) -> None:
        self._step, self.steps = step, steps
        self.done = 0
        self.error: str | None = None
        self._resume = threading.Event()
        self._resume.set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, name="forge_nb-run", daemon=True)

    def start(self) -> BackgroundRun:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.is_set() and (self.steps is None or self.done < self.steps):
            self._resume.wait()
            if self._stop.is_set():
                break
            try:
                self._step()
            except Exception as e:
                self.error = f"step {self.done + 1} failed: {type(e).__name__}: {e}\n{traceback.format_exc()}"
                break
            self.done += 1

    @property
    def state(self) -> str:
        if self._thread.is_alive():
            return "paused" if not self._resume.is_set() else "running"
        return "failed" if self.error else "finished"

    def pause(self) -> None:
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def stop(self, timeout: float | None = 60.0) -> None:
        """Ask the loop to stop after the step in flight, and wait for it."""
        self._stop.set()
        self._resume.set()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run finishes (or `timeout` s pass)."""
        self._thread.join(timeout)
