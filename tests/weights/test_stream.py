"""The TCP-stream transport alone (no mesh): exact copies over several streams, a stalled trainer is
a clear error after the retries, and the version check of a refresh sees a publish mid-copy. Only readers that
prove the session's secret get a byte; garbage, a silent connection, a flood, a request outside the buffers are
each refused, counted, and a reader with the secret still copies meanwhile."""

from __future__ import annotations

import asyncio
import dataclasses
import os
import socket
import time

import pytest
import torch

from forge_nb.runtime.refusals import REFUSED
from forge_nb.weights import stream
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, WeightReceiver
from forge_nb.weights.stream import REQUEST, ChunkServer, StreamError, StreamReader, StreamSpec

SECRET = os.urandom(32)


def reader_of(server: ChunkServer, secret: bytes = SECRET, **options) -> StreamReader:
    return StreamReader(dataclasses.replace(server.spec, secret=secret, **options), chunk_bytes=1 << 20)


def refused(server: ChunkServer) -> dict[str, int]:
    """The server's refusals so far, by why."""
    prefix = f"{server.name}: "
    return {k.removeprefix(prefix): n for k, n in REFUSED.totals().items() if k.startswith(prefix)}


def wait_for(condition, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.02)


def test_several_streams_copy_every_byte():
    buffers = [torch.randint(0, 255, (5_000_003,), dtype=torch.uint8) for _ in range(2)]
    server = ChunkServer(buffers, SECRET)
    reader = reader_of(server, streams=3)
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
        spec = StreamSpec(("127.0.0.1",), silent.getsockname()[1], streams=2, timeout_s=0.2, attempts=2, secret=SECRET)
        reader = StreamReader(spec, chunk_bytes=1 << 20)
        start = time.monotonic()
        with pytest.raises(StreamError, match="failed 2 times.*timed out"):
            reader.read(0, torch.empty(1 << 20, dtype=torch.uint8))
        assert time.monotonic() - start < 5
        reader.close()


def over_tcp(named: list) -> tuple[WeightPublisher, WeightReceiver]:
    """A publisher of `named` at version 0 that serves TCP streams only, and a receiver reading them."""
    publisher = WeightPublisher(named, version=0, use_shm=False, stream_secret=SECRET)
    publisher._rdma = ((), ())  # RDMA is not what these tests are about: no Monarch buffers
    manifest = publisher.manifest()
    manifest = dataclasses.replace(manifest, stream=dataclasses.replace(manifest.stream, secret=SECRET))
    return publisher, WeightReceiver(manifest, version=0, transport="tcp")


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


def test_the_server_listens_at_its_host_only_and_its_spec_carries_no_secret():
    server = ChunkServer([torch.zeros(128, dtype=torch.uint8)], SECRET, "127.0.0.1")
    try:
        assert server._listener.getsockname()[0] == "127.0.0.1" and server.spec.hosts == ("127.0.0.1",)
        assert server.spec.secret == b"" and "secret" not in repr(dataclasses.replace(server.spec, secret=SECRET))
    finally:
        server.close()
    with pytest.raises(ValueError, match="secret"):
        ChunkServer([torch.zeros(128, dtype=torch.uint8)], b"")
    assert WeightPublisher([("w", torch.ones(4))], use_shm=False).manifest(rdma=False).stream is None  # no secret


def test_a_reader_without_the_secret_gets_no_byte_of_a_buffer():
    buffer = torch.randint(0, 255, (1 << 16,), dtype=torch.uint8)
    server = ChunkServer([buffer, buffer], SECRET)
    try:
        before = refused(server).get("no secret", 0)
        with socket.create_connection(("127.0.0.1", server.spec.port), timeout=5) as raw:
            challenge = raw.recv(64)
            raw.sendall(os.urandom(64) + REQUEST.pack(0, 0, 1 << 16))  # a wrong proof, then a request
            got = b""
            try:
                while chunk := raw.recv(1 << 16):
                    got += chunk
            except ConnectionResetError:  # closed with the request unread
                pass
        assert len(challenge) == stream.NONCE and got == b""  # the server's nonce, then it closed
        with pytest.raises(StreamError, match="did not take this reader's secret"):
            reader_of(server, secret=os.urandom(32), attempts=1).read(0, torch.empty_like(buffer))
        wait_for(lambda: refused(server).get("no secret", 0) == before + 2)
        with pytest.raises(ValueError, match="given none"):
            reader_of(server, secret=b"")
    finally:
        server.close()


def test_garbage_silence_a_flood_and_a_bad_request_are_refused_while_a_reader_copies(monkeypatch):
    monkeypatch.setattr(stream, "HANDSHAKE_S", 0.5)
    monkeypatch.setattr(stream, "MAX_HANDSHAKES", 8)
    buffer = torch.randint(0, 255, (1 << 20,), dtype=torch.uint8)
    server = ChunkServer([buffer, buffer], SECRET)
    reader = reader_of(server, streams=2)
    address = ("127.0.0.1", server.spec.port)
    try:
        with socket.create_connection(address) as garbage:
            garbage.sendall(os.urandom(4096))
        flood = [socket.create_connection(address) for _ in range(20)]  # silent: held open, never a byte
        staging = torch.empty_like(buffer)
        reader.read(1, staging)  # the flood fills the handshakes' places; a reader that proves it still gets in
        assert torch.equal(staging, buffer)
        # Past 8 at once the oldest handshakes were closed, the rest after HANDSHAKE_S: the garbage and all 20.
        wait_for(lambda: sum(refused(server).values()) == 21)
        assert refused(server)["too many connections at once"] >= 12 and refused(server)["handshake not finished"]
        for conn in flood:
            conn.close()
        with socket.create_connection(address) as bad:  # proves the secret, then asks past the buffer's end
            StreamReader._prove(reader, bad)
            bad.sendall(REQUEST.pack(0, (1 << 20) - 8, 64))
            assert bad.recv(64) == b""
        wait_for(lambda: refused(server).get("request outside the buffers", 0) == 1)
        reader.read(0, staging)
        assert torch.equal(staging, buffer)
    finally:
        reader.close()
        server.close()
