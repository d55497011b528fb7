"""The TCP-stream transport alone (no mesh): exact copies over several streams, a stalled trainer is
a clear error after the retries, and the version check of a refresh sees a publish mid-copy."""

from __future__ import annotations

import asyncio
import dataclasses
import socket
import time

import pytest
import torch

from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, WeightReceiver
from forge_nb.weights.stream import ChunkServer, StreamError, StreamReader, StreamSpec


def test_several_streams_copy_every_byte():
    buffers = [torch.randint(0, 255, (5_000_003,), dtype=torch.uint8) for _ in range(2)]
    server = ChunkServer(buffers)
    reader = StreamReader(dataclasses.replace(server.spec, streams=3), chunk_bytes=1 << 20)
    try:
        for index in (0, 1):
            staging = torch.empty_like(buffers[index])
            after = reader.read(index, staging)
            assert torch.equal(staging, buffers[index]) and torch.equal(after, buffers[index][:64])
    finally:
        reader.close()
        server.close()


def test_a_stalled_trainer_fails_every_attempt_with_a_clear_error():
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts (backlog) and never answers
        spec = StreamSpec(("127.0.0.1",), silent.getsockname()[1], streams=2, timeout_s=0.2, attempts=2)
        reader = StreamReader(spec, chunk_bytes=1 << 20)
        start = time.monotonic()
        with pytest.raises(StreamError, match="failed 2 times.*TimeoutError"):
            reader.read(0, torch.empty(1 << 20, dtype=torch.uint8))
        assert time.monotonic() - start < 5
        reader.close()


def over_tcp(named: list) -> tuple[WeightPublisher, WeightReceiver]:
    """A publisher of `named` at version 0 that serves TCP streams only, and a receiver reading them."""
    publisher = WeightPublisher(named, version=0, use_shm=False)
    publisher._rdma = ((), ())  # RDMA is not what these tests are about: no Monarch buffers
    return publisher, WeightReceiver(publisher.manifest(), version=0, transport="tcp")


def test_a_publish_during_the_copy_is_refused_and_nothing_is_loaded(monkeypatch):
    named = [("w", torch.ones(1 << 18))]
    publisher, receiver = over_tcp(named)
    publisher.publish([("w", torch.full((1 << 18,), 2.0))], 2)  # v2 into buffer 0
    real = StreamReader._read_once

    def overwritten_mid_copy(self, index, staging, done):
        real(self, index, staging, done)
        publisher.publish([("w", torch.full((1 << 18,), 4.0))], 4)  # v4 lands in buffer 0 meanwhile
        return publisher.buffers[0][:64].clone()  # the header as the copy's last read sees it

    monkeypatch.setattr(StreamReader, "_read_once", overwritten_mid_copy)
    loaded = []
    with pytest.raises(RefreshError, match="asked for policy version 2.*held version 4 at its end"):
        asyncio.run(receiver.refresh(2, lambda tensors: loaded.append(dict(tensors))))
    assert loaded == [] and receiver.version == 0
    publisher._server.close()


@pytest.mark.parametrize("torn", [None, "loading v1 over v0 failed part way (RuntimeError: rank 1 is gone)"])
def test_a_copy_that_fails_says_what_stays_served(monkeypatch, torn):
    """The version served stays live; a replica a failed load left torn stays torn (and refuses to serve)."""
    publisher, receiver = over_tcp([("w", torch.ones(8))])
    receiver.torn = torn
    publisher.publish([("w", torch.full((8,), 2.0))], 1)

    def link_down(self, index, staging):
        raise StreamError("connection refused")

    monkeypatch.setattr(StreamReader, "read", link_down)
    kept = "policy v0 stays live" if torn is None else r"this replica stays torn \(loading v1 over v0"
    with pytest.raises(RefreshError, match=rf"^{kept}.*connection refused"):
        asyncio.run(receiver.refresh(1, lambda tensors: pytest.fail("nothing may load")))
    assert (receiver.version, receiver.torn) == (0, torn)
    publisher._server.close()
