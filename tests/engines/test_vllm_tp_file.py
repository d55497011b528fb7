"""`forge_nb.engines.vllm_tp` without vLLM: the weights file a refresh writes for several ranks, read back as a
rank reads it; a failed write leaves no file in /dev/shm; the cores split among ranks."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

from forge_nb.engines import vllm_tp


class Rank:
    """What `reload_from_file` calls on a vLLM worker: `reload_weights`, here recording what it was given."""

    def reload_weights(self, weights_iterator):
        self.got = [(name, t.clone()) for name, t in weights_iterator]


def test_a_rank_reads_back_every_tensor_as_written():
    tensors = [("w", torch.randn(3, 5)), ("b", torch.ones(4, dtype=torch.bfloat16)), ("i", torch.arange(7))]
    path, layout = vllm_tp.write_weights(iter(tensors))
    try:
        rank = Rank()
        vllm_tp.reload_from_file(rank, path, layout)
    finally:
        os.unlink(path)
    assert [n for n, _ in rank.got] == ["w", "b", "i"]
    assert all(torch.equal(a, b) and a.dtype == b.dtype for (_, a), (_, b) in zip(rank.got, tensors))


def test_a_write_that_fails_leaves_no_file():
    def tensors():
        yield "w", torch.ones(2)
        raise RuntimeError("the refresh failed mid-way")

    before = set(Path("/dev/shm").glob("forge_nb-vllm-weights-*"))
    with pytest.raises(RuntimeError, match="mid-way"):
        vllm_tp.write_weights(tensors())
    assert set(Path("/dev/shm").glob("forge_nb-vllm-weights-*")) == before


def test_the_cores_are_split_among_the_ranks(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 5})
    assert vllm_tp.cpu_binding(2) == "0,1|2,3"
    assert vllm_tp.cpu_binding(6) == "nobind"  # fewer cores than ranks: they share them
