"""Asynchronous run: generation and training overlap (LlamaRL-style), with bounded staleness.

A producer thread keeps generating with the weights the generator serves, pulling the newest
published version between its batches; a consumer thread trains on finished batches as soon as
they arrive. Neither waits for the other except through a small queue. A batch whose policy
version is more than `max_staleness` versions behind the trainer is dropped (counted, never
trained on); the rest are trained as they are, so pick an off-policy-corrected loss such as
``algorithm.loss="aipo"`` when staleness is allowed. Every batch is consumed at most once.
"""

from __future__ import annotations

import queue
import threading
import time
from collections import Counter
from typing import TYPE_CHECKING

from forge_nb.background import RunControl

if TYPE_CHECKING:
    from forge_nb.rollout import Rollout
    from forge_nb.session import Session


class AsyncRun(RunControl):
    """A `RunControl` with two threads, plus sample accounting:
    `produced` = trained + dropped + unconsumed, in samples."""

    def __init__(self, session: Session, steps: int | None, max_staleness: int, queue_size: int = 1) -> None:
        super().__init__()
        self.session, self.steps, self.max_staleness = session, steps, max_staleness
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
        s = self.session
        while not self._stop.is_set():
            self._resume.wait()
            if self._stop.is_set():
                break
            if not self._room.acquire(timeout=0.1):
                continue
            if s.trainer_version > s.generator_version:
                s.sync()  # between generator batches: the trainer is not waiting for it
            rollout = s.rollout()
            self.produced += len(rollout.episodes)
            self._queue.put(rollout)

    def _consume(self) -> None:
        s, last = self.session, time.perf_counter()
        while not self._stop.is_set() and (self.steps is None or self.done < self.steps):
            try:
                rollout = self._queue.get(timeout=0.1)
            except queue.Empty:
                continue
            self._room.release()
            staleness = s.trainer_version - rollout.policy_version
            if staleness > self.max_staleness:
                self.dropped += len(rollout.episodes)
                s.metrics_stream.emit("dropped", step=s.step_count, staleness=staleness, samples=len(rollout.episodes))
                continue
            metrics = s.train(rollout)
            self.staleness[staleness] += 1
            self.trained += len(rollout.episodes)
            self.trained_sample_ids += [e.sample_id for e in rollout.episodes]
            s.step_count += 1
            self.done += 1
            now = time.perf_counter()
            s.metrics_stream.emit("step", **_row(s, rollout, metrics, staleness, now - last))
            last = now
        self._stop.set()

    def wait(self, timeout: float | None = None) -> None:
        """Block until both sides finish; batches still queued become `unconsumed`."""
        super().wait(timeout)
        while not self._queue.empty():
            self.unconsumed.append(self._queue.get_nowait())


def _row(s: Session, rollout: Rollout, metrics: dict, staleness: int, step_s: float) -> dict:
    return {
        "step": s.step_count, "policy_version": metrics["policy_version"], "mode": "async",
        "generator_version": s.generator_version, "staleness": staleness,
        "mean_reward": rollout.mean_reward, "accuracy": rollout.accuracy, "tokens_per_s": rollout.tokens_per_s,
        "generate_s": rollout.generate_s, "score_s": rollout.score_s, "reference_s": rollout.reference_s,
        "train_s": metrics["train_seconds"],
        "refresh_s": 0.0, "refresh_gbps": 0.0, "loss": metrics["loss"], "grad_norm": metrics["grad_norm"],
        "step_s": step_s,
    }  # fmt: skip
