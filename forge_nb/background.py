"""Background runs: train in threads so the kernel stays responsive.

Pause, resume and stop take effect at batch boundaries. An exception stops the run and is kept
(`error`) for `status()` and the dashboard; it is never swallowed.
"""

from __future__ import annotations

import threading
import traceback
from collections.abc import Callable


class RunControl:
    """What every background run shares: its threads, pause / resume / stop, state and error."""

    def __init__(self) -> None:
        self.done = 0
        self.error: str | None = None
        self._resume, self._stop = threading.Event(), threading.Event()
        self._resume.set()
        self._threads: list[threading.Thread] = []

    def _thread(self, loop: Callable[[], None], name: str) -> threading.Thread:
        """A daemon thread running `loop`; an exception is recorded and stops the whole run."""

        def run() -> None:
            try:
                loop()
            except Exception as e:
                self.error = f"{name}: {type(e).__name__}: {e}\n{traceback.format_exc()}"
                self._stop.set()

        thread = threading.Thread(target=run, name=name, daemon=True)
        self._threads.append(thread)
        return thread

    def start(self):
        for t in self._threads:
            t.start()
        return self

    @property
    def state(self) -> str:
        if any(t.is_alive() for t in self._threads):
            return "paused" if not self._resume.is_set() else "running"
        return "failed" if self.error else "finished"

    def pause(self) -> None:
        self._resume.clear()

    def resume(self) -> None:
        self._resume.set()

    def stop(self, timeout: float | None = 60.0) -> None:
        """Ask the run to stop after the batch in flight, and wait for it."""
        self._stop.set()
        self._resume.set()
        self.wait(timeout)

    def wait(self, timeout: float | None = None) -> None:
        """Block until the run finishes (or `timeout` s pass)."""
        for t in self._threads:
            if t is not threading.current_thread():
                t.join(timeout)


class BackgroundRun(RunControl):
    """Calls `step()` until `steps` steps are done (None: until stopped)."""

    def __init__(self, step: Callable[[], object], steps: int | None) -> None:
        super().__init__()
        self._step, self.steps = step, steps
        self._thread(self._loop, "forge_nb-run")

    def _loop(self) -> None:
        while not self._stop.is_set() and (self.steps is None or self.done < self.steps):
            self._resume.wait()
            if self._stop.is_set():
                break
            try:
                self._step()
            except Exception as e:
                raise RuntimeError(f"step {self.done + 1} failed: {type(e).__name__}: {e}") from e
            self.done += 1
