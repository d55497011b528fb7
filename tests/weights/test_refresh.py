"""Publisher and receiver over real /dev/shm buffers (the RDMA path is covered with actors)."""

import asyncio

import pytest
import torch

from forge_nb.weights.manifest import checksum
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, RefreshReport, TornWeights, WeightReceiver
from tests.weights.shm_manifest import shm_manifest


def _receiver(publisher: WeightPublisher) -> WeightReceiver:
    receiver = WeightReceiver(shm_manifest(publisher), version=0, transport="shm")
    publisher.unlink()  # mapped on both sides: the names can go
    return receiver


def _load_into(target: dict):
    return lambda named: target.update({n: t.clone() for n, t in named})


def test_refresh_loads_the_published_version_and_skips_an_unchanged_one():
    weights = {"a": torch.randn(4, 4), "b": torch.randn(3)}
    publisher = WeightPublisher(weights.items(), version=0)
    receiver, loaded = _receiver(publisher), {}
    weights["a"] += 1
    publisher.publish(weights.items(), version=1)
    report = asyncio.run(receiver.refresh(1, _load_into(loaded)))
    assert (report.version, report.previous_version, report.skipped, report.transport) == (1, 0, False, "shm")
    assert report.bytes == publisher.nbytes and report.gbps > 0
    assert checksum(loaded.items()) == checksum(weights.items())
    again = asyncio.run(receiver.refresh(1, lambda named: pytest.fail("an unchanged version must not load")))
    assert again.skipped and again.bytes == 0


def test_a_version_overwritten_before_the_read_is_refused_and_nothing_loads():
    publisher = WeightPublisher([("w", torch.zeros(2))], version=0)
    receiver = _receiver(publisher)
    for v in (1, 2, 3):  # buffer 1 now holds v3: v1 is gone
        publisher.publish([("w", torch.full((2,), float(v)))], version=v)
    with pytest.raises(RefreshError, match="asked for policy version 1, the published buffer held version 3"):
        asyncio.run(receiver.refresh(1, lambda named: pytest.fail("must not load")))
    assert receiver.version == 0
    loaded = {}
    asyncio.run(receiver.refresh(3, _load_into(loaded)))
    assert torch.equal(loaded["w"], torch.full((2,), 3.0))


def test_a_load_that_fails_part_way_leaves_the_receiver_torn_until_a_whole_version_loads():
    weights = {"a": torch.zeros(2), "b": torch.zeros(3)}
    publisher = WeightPublisher(weights.items(), version=0)
    receiver, served = _receiver(publisher), {n: t.clone() for n, t in weights.items()}

    def fails_after_one(named):  # as vLLM's load when a rank is lost: some tensors replaced, then an error
        name, tensor = next(iter(named))
        served[name] = tensor.clone()
        raise RuntimeError("rank 1 is gone")

    publisher.publish([(n, t + 1) for n, t in weights.items()], version=1)
    with pytest.raises(TornWeights, match=r"loading v1 over v0 failed part way \(RuntimeError: rank 1 is gone\)"):
        asyncio.run(receiver.refresh(1, fails_after_one))
    assert receiver.version == 0 and "v1 over v0" in receiver.torn
    assert torch.equal(served["a"], torch.ones(2)) and torch.equal(served["b"], torch.zeros(3))  # a mix
    # Back to the version it served before (a checkpoint restored): not skipped, a torn one loads whole.
    publisher.publish(weights.items(), version=0)
    report = asyncio.run(receiver.refresh(0, _load_into(served)))
    assert not report.skipped and receiver.torn is None and receiver.version == 0
    assert checksum(served.items()) == checksum(weights.items())
    publisher.unlink()


def test_publish_is_a_snapshot_not_a_view_of_live_parameters():
    w = torch.zeros(3)
    publisher = WeightPublisher([("w", w)], version=0)
    receiver = _receiver(publisher)
    w += 7
    publisher.publish([("w", w)], version=1)
    w += 100  # the optimizer goes on; readers still see version 1
    loaded = {}
    asyncio.run(receiver.refresh(1, _load_into(loaded)))
    assert torch.equal(loaded["w"], torch.full((3,), 7.0))


def test_serving_dtype_is_converted_on_publish():
    w = torch.randn(5, dtype=torch.float32)
    publisher = WeightPublisher([("w", w)], version=0, dtype=torch.bfloat16)
    receiver, loaded = _receiver(publisher), {}
    publisher.publish([("w", w)], version=1)
    report = asyncio.run(receiver.refresh(1, _load_into(loaded)))
    assert loaded["w"].dtype == torch.bfloat16 and torch.equal(loaded["w"], w.bfloat16())
    assert report.bytes < 64 + 5 * 4 + 64


def test_unlink_leaves_no_shared_memory_file():
    from pathlib import Path

    publisher = WeightPublisher([("w", torch.zeros(2))], version=0)
    paths = [Path(p) for p in publisher.shm_paths]
    assert all(p.exists() for p in paths)
    publisher.unlink()
    assert not any(p.exists() for p in paths)


def test_replica_reports_combine_bytes_added_and_the_slowest_time():
    a = RefreshReport(3, 2, 1000, 0.5, 0.4, False, "shm")
    b = RefreshReport(3, 2, 1000, 1.0, 0.9, False, "rdma")
    both = RefreshReport.combine([a, b])
    assert (both.bytes, both.seconds, both.transfer_seconds, both.replicas) == (2000, 1.0, 0.9, 2)
    assert both.transport == "rdma+shm" and both.gbps == pytest.approx(2000 / 1.0 / 1e9)
    assert RefreshReport.combine([a]) is a
    with pytest.raises(RefreshError, match=r"different versions \[3, 4\]"):
        RefreshReport.combine([a, RefreshReport(4, 3, 1000, 0.5, 0.4, False, "shm")])
