"""Shard-direct refresh: each rank of a sharded trainer publishes its own rows, a receiver copies every
rank's buffers and loads whole tensors only when every copy is the version asked for."""

import asyncio
import dataclasses

import pytest
import torch

from forge_nb.weights.manifest import checksum
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, WeightReceiver
from forge_nb.weights.shards import ShardMismatch, check_cover, whole_shapes
from tests.weights.shm_manifest import shm_manifest

WHOLE = {"embed": torch.randn(5, 4), "norm": torch.randn(3), "lm_head": torch.randn(4, 2)}


def _shards(rank: int, ranks: int, weights: dict) -> tuple[list, dict]:
    """Rank `rank`'s rows of each tensor as FSDP2 cuts dim 0 (torch.chunk: the last ranks may get fewer
    or none), and which rows they are."""
    named, rows = [], {}
    for name, t in weights.items():
        size = -(-t.shape[0] // ranks)
        start = min(rank * size, t.shape[0])
        named.append((name, t[start : start + size]))
        rows[name] = (start, t.shape[0])
    return named, rows


def _publishers(weights: dict, ranks: int = 2) -> list[WeightPublisher]:
    publishers = []
    for rank in range(ranks):
        named, rows = _shards(rank, ranks, weights)
        publishers.append(WeightPublisher(named, rows=rows, rank=rank, ranks=ranks))
    return publishers


def _load_into(target: dict):
    return lambda named: target.update({n: t.clone() for n, t in named})


def test_a_receiver_puts_whole_tensors_together_from_every_ranks_shards():
    weights = {k: v.clone() for k, v in WHOLE.items()}
    publishers = _publishers(weights, ranks=3)  # norm's 3 rows: one a rank; embed's 5: 2, 2, 1
    receiver = WeightReceiver([shm_manifest(p) for p in publishers], version=0, transport="shm")
    for name in weights:
        weights[name] += 1.0
    for r, p in enumerate(publishers):
        p.publish(_shards(r, 3, weights)[0], version=1)
    loaded = {}
    report = asyncio.run(receiver.refresh(1, _load_into(loaded)))
    assert checksum(loaded.items()) == checksum(weights.items())
    assert report.bytes == sum(p.nbytes for p in publishers) and report.transport == "shm"
    for p in publishers:
        p.unlink()


def test_a_version_one_rank_has_not_published_is_refused_and_the_served_one_stays():
    weights = {k: v.clone() for k, v in WHOLE.items()}
    publishers = _publishers(weights)
    receiver = WeightReceiver([shm_manifest(p) for p in publishers], version=0, transport="shm")
    publishers[0].publish(_shards(0, 2, weights)[0], version=1)  # rank 1 has not published v1 yet
    with pytest.raises(RefreshError, match="trainer rank 1: the published buffer held version -1"):
        asyncio.run(receiver.refresh(1, lambda named: pytest.fail("nothing loads from a torn version")))
    assert receiver.version == 0
    publishers[1].publish(_shards(1, 2, weights)[0], version=1)
    loaded = {}
    asyncio.run(receiver.refresh(1, _load_into(loaded)))
    assert checksum(loaded.items()) == checksum(weights.items())
    for p in publishers:
        p.unlink()


def test_manifests_that_do_not_cover_the_model_are_refused():
    publishers = _publishers(WHOLE)
    manifests = [shm_manifest(p) for p in publishers]
    with pytest.raises(ShardMismatch, match="manifests of ranks"):
        check_cover(manifests[:1] + [dataclasses.replace(manifests[1], rank=0)])
    short = dataclasses.replace(manifests[1], slots=manifests[1].slots[:-1])
    with pytest.raises(ShardMismatch, match="rank 1 publishes other tensors"):
        check_cover([manifests[0], short])
    shifted = [dataclasses.replace(s, row_start=s.row_start + 1) for s in manifests[1].slots]
    with pytest.raises(ShardMismatch, match="rows from"):
        check_cover([manifests[0], dataclasses.replace(manifests[1], slots=tuple(shifted))])
    for p in publishers:
        p.unlink()


def test_whole_shapes_are_what_the_ranks_publish_together():
    publishers = _publishers(WHOLE, ranks=3)  # norm's 3 rows: one a rank (and lm_head's 4: 2, 2, 0)
    manifests = [shm_manifest(p) for p in publishers]
    assert whole_shapes(manifests) == {name: tuple(t.shape) for name, t in WHOLE.items()}
    assert whole_shapes(manifests[:1]) == whole_shapes(manifests)  # any rank's manifest names the whole
    for p in publishers:
        p.unlink()
