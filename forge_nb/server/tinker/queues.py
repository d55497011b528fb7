"""The queues behind Tinker's futures: a request is answered with its id at once and runs here, on a thread of
its own kind, so a client that sends many before reading any (as Tinker's docs advise) gets them batched.

- `TrainingQueue`: the model's training requests, in the order they arrived (the SDK sends a training client's
  requests one turn after another: arrival order is its seq_id order, up to the chunks of one forward_backward,
  whose gradients add up in any order). Consecutive forward_backwards of the same loss run as one batch on the
  trainer gang: the losses are sums, so the merged batch's gradient is theirs, and each request gets its own
  datums' logprobs and loss back.
- `SamplingQueue`: sample requests; those waiting together go to the generators in one call per way of
  sampling (`TinkerMesh.sample`).

A request that fails answers Tinker's `RequestFailedResponse`: "user" for a bad request (`BadRequest`), "server"
for anything else (its traceback goes to the session server's log); the session goes on either way.
"""

from __future__ import annotations

import queue
import threading
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from forge_nb.rl.target_batch import Datums
from forge_nb.server.tinker import wire
from forge_nb.server.tinker.checkpoints import NotFound
from forge_nb.server.tinker.futures import Failed, Futures
from forge_nb.server.tinker.mesh import SampleJob, TinkerMesh

MAX_DATUMS = 1024  # datums one merged forward_backward takes at most (the SDK's own chunk size)
GATHER_S = 0.01  # a sample request waits this long for others that come with it (a burst of a client's gather)
GATHER_MAX_S = 0.1
STOP_S = 10.0  # a queue's thread is waited for this long when the API stops (it is a daemon: it cannot outlive us)


@dataclass
class _Work:
    request_id: str
    run: Callable[[], Any] | None = None  # any request but a forward_backward: its result
    call: wire.ForwardBackwardCall | None = None
    enqueued: float = field(default_factory=time.perf_counter)


def failure(error: BaseException) -> Failed:
    """An exception as Tinker's failed-request answer (the server's own errors are printed to its log)."""
    if isinstance(error, wire.BadRequest | NotFound):
        return Failed(str(error), "user")
    traceback.print_exception(type(error), error, error.__traceback__)
    return Failed(f"forge_nb: {type(error).__name__}: {error}", "server")


class TrainingQueue:
    """Training requests run one after another on a thread (see the module docstring)."""

    def __init__(self, mesh: TinkerMesh, futures: Futures) -> None:
        self.mesh, self.futures = mesh, futures
        self._queue: queue.Queue[_Work | None] = queue.Queue()
        self.batches = 0  # forward_backward batches run (each one trainer call)
        self.merged = 0  # forward_backward requests run in them
        self._thread = threading.Thread(target=self._serve, name="forge_nb-tinker-training", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, run: Callable[[], Any]) -> None:
        """Run `run()` in turn; its return value (a JSON dict) answers `request_id`."""
        self._queue.put(_Work(request_id, run=run))

    def submit_forward_backward(self, request_id: str, call: wire.ForwardBackwardCall) -> None:
        self._queue.put(_Work(request_id, call=call))

    def stop(self) -> None:
        """Stop after what is queued (a call in flight when the session goes down fails, then the thread ends)."""
        self._queue.put(None)
        self._thread.join(STOP_S)

    def _serve(self) -> None:
        while True:
            work = [self._queue.get()]
            while not self._queue.empty():
                work.append(self._queue.get())
            stop = None in work
            self._run([w for w in work if w is not None])
            if stop:
                return

    def _run(self, work: list[_Work]) -> None:
        i = 0
        while i < len(work):
            if work[i].call is None:
                self._run_one(work[i])
                i += 1
                continue
            batch = [work[i]]
            datums = len(work[i].call.datums)
            while i + len(batch) < len(work):
                following = work[i + len(batch)]
                if following.call is None or following.call.key != batch[0].call.key:
                    break
                if datums + len(following.call.datums) > MAX_DATUMS:
                    break
                batch.append(following)
                datums += len(following.call.datums)
            self._forward_backward(batch)
            i += len(batch)

    def _run_one(self, work: _Work) -> None:
        try:
            result = work.run()
        except BaseException as e:
            result = failure(e)
        self.futures.resolve(work.request_id, result)

    def _forward_backward(self, batch: list[_Work]) -> None:
        """Requests computing the same loss as one trainer call; each gets its own datums' results."""
        first = batch[0].call
        merged = Datums(
            [t for w in batch for t in w.call.datums.tokens],
            [t for w in batch for t in w.call.datums.targets],
            {name: [row for w in batch for row in w.call.datums.inputs[name]] for name in first.datums.inputs},
        )
        try:
            logprobs, losses = self.mesh.forward_backward(merged, first.loss_fn, first.config, first.forward_only)
        except BaseException as e:
            failed = failure(e)
            for w in batch:
                self.futures.resolve(w.request_id, failed)
            return
        self.batches += 1
        self.merged += len(batch)
        start = 0
        for w in batch:
            n = len(w.call.datums)
            loss = sum(losses[start : start + n])
            output = wire.forward_backward_output(logprobs[start : start + n], {"loss:sum": loss})
            self.futures.resolve(w.request_id, output)
            start += n


class SamplingQueue:
    """Sample requests, gathered while the generators are busy (or for a moment when they are not) and
    answered together (see the module docstring)."""

    def __init__(self, mesh: TinkerMesh, futures: Futures) -> None:
        self.mesh, self.futures = mesh, futures
        self._queue: queue.Queue[tuple[str, SampleJob] | None] = queue.Queue()
        self.calls = 0  # `TinkerMesh.sample` calls
        self.requests = 0
        self._thread = threading.Thread(target=self._serve, name="forge_nb-tinker-sampling", daemon=True)
        self._thread.start()

    def submit(self, request_id: str, job: SampleJob) -> None:
        self._queue.put((request_id, job))

    def stop(self) -> None:
        """Stop after what is queued (a call in flight when the session goes down fails, then the thread ends)."""
        self._queue.put(None)
        self._thread.join(STOP_S)

    def _serve(self) -> None:
        while True:
            items = [self._queue.get()]
            deadline = time.perf_counter() + GATHER_MAX_S
            while items[-1] is not None and time.perf_counter() < deadline:
                try:
                    items.append(self._queue.get(timeout=GATHER_S))
                except queue.Empty:
                    break
            while not self._queue.empty():
                items.append(self._queue.get())
            stop = None in items
            jobs = [item for item in items if item is not None]
            if jobs:
                self._sample(jobs)
            if stop:
                return

    def _sample(self, jobs: list[tuple[str, SampleJob]]) -> None:
        try:
            answers = self.mesh.sample([job for _, job in jobs])
        except BaseException as e:
            failed = failure(e)
            for request_id, _ in jobs:
                self.futures.resolve(request_id, failed)
            return
        self.calls += 1
        self.requests += len(jobs)
        for (request_id, _), answer in zip(jobs, answers):
            sequences = [
                wire.Sequence(c.token_ids, c.logprobs, "stop" if c.finish_reason == "stop" else "length")
                for c in answer.completions
            ]
            self.futures.resolve(request_id, wire.sample_response(sequences, answer.prompt_logprobs))
