"""Background runs, sync or async: the step (`forge_nb.step`) in threads, so the kernel stays free.

Everything here drives a `StepDriver` (the session satisfies it): its locked step and phases, the
policy versions and the step counter. Each trained batch becomes one `StepRow` on the metrics
stream, whichever way it was run.

Background runs live in threads so the kernel stays responsive. Pause, resume and stop take
effect at batch boundaries. An exception stops the run and is kept (`error`) for `status()` and
the dashboard; it is never swallowed.

The async run overlaps generation and training (LlamaRL-style), with bounded staleness: a producer
keeps generating with the weights the generator serves, pulling the newest published version
between its batches; a consumer trains on finished batches as they arrive. A batch more than
`max_staleness` versions behind the trainer is dropped (counted, never trained on); the rest are
trained as they are, so pick an off-policy-corrected loss such as ``algorithm.loss="aipo"`` when
staleness is allowed. Every batch is consumed at most once.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections import Counter
from collections.abc import Callable
from typing import Any, Protocol

from forge_nb.actors.trainer import LossFailedAfterSteps
from forge_nb.rl.rollout import Rollout
from forge_nb.state import RunState
from forge_nb.step import StepRow, record_step, staleness


class StepDriver(Protocol):
    """What the loop needs from a session: its locked phases (`forge_nb.step` does the work) and the
    run's state (policy versions, metrics stream, step counter)."""

    state: RunState

    def sync_step(self) -> StepRow:
        """rollout -> train -> sync, holding both sides, then the step boundary (`after_step`)."""
        ...

    def rollout(self) -> Rollout: ...

    def train(self, rollout: Rollout) -> dict[str, Any]: ...

    def sync(self) -> dict[str, Any]: ...

    def after_step(self, row: StepRow, rollout: Rollout, train: dict[str, Any]) -> None:
        """At the step boundary: evaluation and checkpoint when due, watches (which may pause the run)."""
        ...

    def on_dropped(self, rollout: Rollout, staleness: int) -> None:
        """A batch the async run dropped as too stale (never trained on)."""
        ...


class RunError(RuntimeError):
    """A background run cannot start: one is already running, or the mode is unknown."""


class RunSlot:
    """The one background run a session may have at a time (kept after it ends: its state, error)."""

    def __init__(self) -> None:
        self.current: BackgroundRun | AsyncRun | None = None

    def start(self, driver: StepDriver, steps: int | None, mode: str, max_staleness: int) -> BackgroundRun | AsyncRun:
        """Start a run: `mode` "sync" (one `sync_step` after another) or "async" (see `AsyncRun`)."""
        if self.current is not None and self.current.state in ("running", "paused"):
            raise RunError(f"forge_nb: a background run is already {self.current.state}; stop() it first")
        if mode == "sync":
            self.current = BackgroundRun(driver.sync_step, steps)
        elif mode == "async":
            self.current = AsyncRun(driver, steps, max_staleness)
        else:
            raise RunError(f"forge_nb: run mode must be 'sync' or 'async', got {mode!r}")
        return self.current.start()

    def pause(self) -> None:
        if self.current is not None:
            self.current.pause()

    def resume(self) -> None:
        if self.current is not None:
            self.current.resume()

    def stop(self) -> None:
        if self.current is not None:
            self.current.stop()


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
            except LossFailedAfterSteps as e:  # trained in part, and the step finished (synced, row written)
                self.done += 1
                raise RuntimeError(f"step {self.done} failed: {type(e).__name__}: {e}") from e
            except Exception as e:
                raise RuntimeError(f"step {self.done + 1} failed: {type(e).__name__}: {e}") from e
            self.done += 1


class AsyncRun(RunControl):
    """Generation and training in two threads, plus sample accounting:
    `produced` = trained + dropped + unconsumed, in samples."""

    def __init__(self, driver: StepDriver, steps: int | None, max_staleness: int, queue_size: int = 1) -> None:
        super().__init__()
        self.driver, self.steps, self.max_staleness = driver, steps, max_staleness
        self.produced = self.trained = self.dropped = 0
        self.unconsumed: list[Rollout] = []
        self.trained_sample_ids: list[int] = []
        self.staleness = Counter()  # versions behind at train time -> batches
        self._queue: queue.Queue[Rollout] = queue.Queue()
        # A batch is generated only once there is room for it: generating ahead of the queue would
        # only make batches stale (and dropped) by the time the trainer gets to them.
        self._room = threading.Semaphore(queue_size)
        self._thread(self._produce, "forge_nb-async-generate")
        self._thread(self._consume, "forge_nb-async-train")

    def _produce(self) -> None:
        d = self.driver
        while not self._stop.is_set():
            self._resume.wait()
            if self._stop.is_set():
                break
            if not self._room.acquire(timeout=0.1):
                continue
            if d.state.versions.lag > 0:
                d.sync()  # between generator batches: the trainer is not waiting for it
            rollout = d.rollout()
            self.produced += len(rollout.episodes)
            self._queue.put(rollout)

    def _consume(self) -> None:
        d, last = self.driver, time.perf_counter()
        while not self._stop.is_set() and (self.steps is None or self.done < self.steps):
            try:
                rollout = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._room.release()
            behind = staleness(d.state, rollout)
            if behind > self.max_staleness:
                self.dropped += len(rollout.episodes)
                samples = len(rollout.episodes)
                d.state.metrics.emit("dropped", step=d.state.step_count, staleness=behind, samples=samples)
                d.on_dropped(rollout, behind)
                continue
            try:
                train, failed = d.train(rollout), None
            except LossFailedAfterSteps as e:  # trained in part: account for it, then stop the run
                train, failed = e.metrics, e
            self.staleness[train["staleness"]] += 1
            self.trained += len(rollout.episodes)
            self.trained_sample_ids += [e.sample_id for e in rollout.episodes]
            self.done += 1
            now = time.perf_counter()
            row = record_step(d.state, "async", rollout, train, now - last)
            d.after_step(row, rollout, train)  # a checkpoint holds both sides: waits for the rollout in flight
            last = now
            if failed is not None:
                raise failed
        self._stop.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until both sides finish; batches still queued become `unconsumed`."""
        super().wait(timeout)
        while not self._queue.empty():
            self.unconsumed.append(self._queue.get_nowait())
