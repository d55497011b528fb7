import asyncio

import pytest
import torch

from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, WeightReceiver


class LocalBuffer:
    """Stands in for an RDMABuffer in this unit test: reads copy from a local tensor."""

    def __init__(self, flat: torch.Tensor) -> None:
        self.flat = flat

    async def read_into(self, dst: torch.Tensor) -> None:
        dst.copy_(self.flat)


def _receiver(publisher: WeightPublisher) -> WeightReceiver:
    manifest = WeightManifest(publisher.slots, publisher.nbytes, LocalBuffer(publisher.flat))
    return WeightReceiver(manifest, version=0)


def test_refresh_loads_the_published_version_and_skips_an_unchanged_one():
    weights = {"a": torch.randn(4, 4), "b": torch.randn(3)}
    publisher = WeightPublisher(weights.items(), version=0)
    receiver, loaded = _receiver(publisher), {}
    weights["a"] += 1
    publisher.publish(weights.items(), version=1)
    report = asyncio.run(receiver.refresh(1, lambda named: loaded.update({n: t.clone() for n, t in named})))
    assert (report.version, report.previous_version, report.skipped) == (1, 0, False)
    assert report.bytes == publisher.nbytes and report.gbps > 0
    assert checksum(loaded.items()) == checksum(weights.items())
    again = asyncio.run(receiver.refresh(1, lambda named: pytest.fail("an unchanged version must not load")))
    assert again.skipped and again.bytes == 0


def test_refresh_refuses_bytes_of_another_version():
    publisher = WeightPublisher([("w", torch.zeros(2))], version=0)
    receiver = _receiver(publisher)
    with pytest.raises(RefreshError, match="asked for policy version 5, the published buffer holds 0"):
        asyncio.run(receiver.refresh(5, lambda named: None))
    assert receiver.version == 0


def test_publish_is_a_snapshot_not_a_view_of_live_parameters():
    w = torch.zeros(3)
    publisher = WeightPublisher([("w", w)], version=0)
    w += 7
    loaded = {}
    publisher.publish([("w", w)], version=1)
    w += 100  # the optimizer goes on; readers still see version 1
    asyncio.run(_receiver(publisher).refresh(1, lambda named: loaded.update(dict(named))))
    assert torch.equal(loaded["w"], torch.full((3,), 7.0))
