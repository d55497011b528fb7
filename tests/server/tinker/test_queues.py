"""The queues behind Tinker's futures: requests that wait together run together (forward_backwards of one loss as
one trainer call, samples as one generator call), each gets its own part of the answer, in order, and a failure
answers Tinker's failed-request shape and leaves the queue running. A stand-in mesh: no actors."""

from __future__ import annotations

import asyncio
import threading

import pytest

pytest.importorskip("tinker")

from tinker.proto import tinker_public_pb2 as pb  # noqa: E402

from forge_nb.engines.base import SamplingParams  # noqa: E402
from forge_nb.rl.completion import Completion  # noqa: E402
from forge_nb.rl.target_batch import Datums  # noqa: E402
from forge_nb.server.tinker import wire  # noqa: E402
from forge_nb.server.tinker.futures import Failed, Futures  # noqa: E402
from forge_nb.server.tinker.mesh import Sampled, SampleJob  # noqa: E402
from forge_nb.server.tinker.queues import SamplingQueue, TrainingQueue  # noqa: E402


class Mesh:
    """Runs nothing: each call waits for `gate` (set: free), then answers from what it was given."""

    def __init__(self) -> None:
        self.gate = threading.Event()
        self.started = threading.Event()
        self.calls: list = []
        self.fail = False

    def forward_backward(self, datums, loss, config, forward_only):
        self.started.set()
        self.gate.wait(10)
        self.calls.append(("forward_backward", len(datums)))
        if self.fail:
            raise wire.BadRequest("data[0]: refused")
        return [[float(t) for t in row] for row in datums.tokens], [float(sum(row)) for row in datums.tokens]

    def sample(self, jobs):
        self.started.set()
        self.gate.wait(10)
        self.calls.append(("sample", len(jobs)))
        if self.fail:
            raise RuntimeError("a generator proc died")
        return [Sampled([Completion(j.prompt, [9, 2], [-0.5, -0.1], "", "stop")], None, 3) for j in jobs]


def call(tokens: list[int], loss: str = "cross_entropy", seq: int = 1) -> wire.ForwardBackwardCall:
    return wire.ForwardBackwardCall(
        "m", seq, loss, {}, False, Datums([tokens], [tokens], {"weights": [[1.0] * len(tokens)]})
    )


def result(futures: Futures, request_id: str):
    return asyncio.run(futures.wait(request_id, timeout=10))


def test_forward_backwards_waiting_together_run_as_one_call_each_getting_its_own_answer():
    mesh, futures = Mesh(), Futures()
    queue = TrainingQueue(mesh, futures)
    try:
        ids = [futures.new() for _ in range(5)]
        queue.submit_forward_backward(ids[0], call([1, 2]))
        assert mesh.started.wait(10)  # the first runs alone; the others wait for it
        queue.submit_forward_backward(ids[1], call([3, 4, 5]))
        queue.submit_forward_backward(ids[2], call([6]))
        queue.submit(ids[3], lambda: {"metrics": {"step:max": 1.0}})  # an optim_step: the batch ends before it
        queue.submit_forward_backward(ids[4], call([7, 8]))
        mesh.gate.set()
        answers = [result(futures, i) for i in ids]
    finally:
        queue.stop()
    assert mesh.calls == [("forward_backward", 1), ("forward_backward", 2), ("forward_backward", 1)]
    outputs = [pb.ForwardBackwardOutput.FromString(a) for a in (answers[0], answers[1], answers[2], answers[4])]
    assert [o.metrics["loss:sum"] for o in outputs] == [3.0, 12.0, 6.0, 15.0]
    assert [o.loss_fn_outputs[0].num_datums for o in outputs] == [1, 1, 1, 1]
    assert answers[3] == {"metrics": {"step:max": 1.0}}
    assert (queue.batches, queue.merged) == (3, 4)


def test_only_forward_backwards_of_the_same_loss_and_inputs_merge():
    a, b = call([1], "cross_entropy"), call([2], "importance_sampling")
    assert a.key != b.key and call([1]).key == call([5, 6]).key


def test_a_failed_batch_answers_each_request_in_tinkers_shape_and_the_queue_goes_on():
    mesh, futures = Mesh(), Futures()
    queue = TrainingQueue(mesh, futures)
    mesh.gate.set()
    try:
        mesh.fail = True
        first = futures.new()
        queue.submit_forward_backward(first, call([1]))
        assert result(futures, first) == Failed("data[0]: refused", "user")
        mesh.fail = False
        second = futures.new()
        queue.submit_forward_backward(second, call([1]))
        assert pb.ForwardBackwardOutput.FromString(result(futures, second)).metrics["loss:sum"] == 1.0
        bug = futures.new()
        queue.submit(bug, lambda: 1 / 0)
        assert result(futures, bug).category == "server"
    finally:
        queue.stop()


def test_samples_waiting_together_go_to_the_generators_in_one_call():
    mesh, futures = Mesh(), Futures()
    queue = SamplingQueue(mesh, futures)
    sampling = SamplingParams(max_tokens=2)
    try:
        first = futures.new()
        queue.submit(first, SampleJob([1, 2], sampling))
        assert mesh.started.wait(10)
        rest = [futures.new() for _ in range(6)]
        for i in rest:
            queue.submit(i, SampleJob([3], sampling))
        mesh.gate.set()
        answers = [result(futures, i) for i in [first, *rest]]
    finally:
        queue.stop()
    assert mesh.calls == [("sample", 1), ("sample", 6)]
    for answer in answers:
        sequence = pb.SampleResponse.FromString(answer).sequences[0]
        assert sequence.stop_reason == pb.STOP_REASON_STOP and len(sequence.tokens) == 8  # 2 int32 tokens


def test_a_request_not_done_in_time_answers_none_then_its_result():
    futures = Futures()
    request_id = futures.new()
    assert asyncio.run(futures.wait(request_id, timeout=0.01)) is None  # the route answers 408: poll again
    futures.resolve(request_id, {"ok": True})
    assert result(futures, request_id) == {"ok": True}
    with pytest.raises(KeyError):
        asyncio.run(futures.wait("req-unknown"))
