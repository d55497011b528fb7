"""The "group" transport's own path on gloo (NCCL's stand-in here): the receivers ask for a version, the trainer
rank's sender thread broadcasts its snapshot, every member loads it; a snapshot that holds another version by
then is refused, nothing loaded; a publish into the buffer being sent waits for the send. Members are threads
here (each its own process group); the session runs them in procs (tests/weights/test_refresh_mesh.py)."""

import asyncio
import dataclasses
import threading
import time

import pytest
import torch

from forge_nb.weights.group import GroupSender, group_spec
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import RefreshError, WeightReceiver

WEIGHTS = {"w": torch.randn(64, 32), "b": torch.randn(32)}


def _in_threads(*fns):
    """Run `fns` at once -> their results (an exception in one is raised here)."""
    results, errors = [None] * len(fns), []

    def run(i, fn):
        try:
            results[i] = fn()
        except BaseException as e:
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i, fn)) for i, fn in enumerate(fns)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    if errors:
        raise errors[0]
    return results


@pytest.fixture
def group():
    """A publisher, its member-0 end and two receivers on one group."""
    publisher = WeightPublisher(WEIGHTS.items())
    spec = group_spec(("127.0.0.1",), 3, "gloo", 30.0)
    manifest = dataclasses.replace(publisher.manifest(rdma=False), group=spec)
    sender, *receivers = _in_threads(
        lambda: GroupSender(spec, publisher.snapshot, publisher.lock),
        lambda: WeightReceiver(manifest, transport="group", member=1),
        lambda: WeightReceiver(manifest, transport="group", member=2),
    )
    yield publisher, sender, receivers
    sender.stop()
    publisher.unlink()


def _refresh(receivers, version: int):
    """Both receivers refresh to `version` (the sender answers) -> what each loaded (or the RefreshError each
    raised)."""
    loaded = [{}, {}]

    def receive(i):
        try:
            return asyncio.run(receivers[i].refresh(version, lambda named: loaded[i].update(named)))
        except RefreshError as e:
            return e

    return _in_threads(lambda: receive(0), lambda: receive(1)), loaded


def _sent(sender, count: int = 1, timeout: float = 10.0) -> list[int]:
    """The versions `sender` recorded as sent, once it has `count` (it records right after the broadcast
    returns on its own thread, which can be after the receivers' have)."""
    deadline = time.monotonic() + timeout
    while len(sender.sent) < count and time.monotonic() < deadline:
        time.sleep(0.01)
    return sender.sent


def test_every_member_loads_the_broadcast_version(group):
    publisher, sender, receivers = group
    moved = {n: t * 2 for n, t in WEIGHTS.items()}
    publisher.publish(moved.items(), 1)
    reports, loaded = _refresh(receivers, 1)
    assert [(r.version, r.transport) for r in reports] == [(1, "group"), (1, "group")] and _sent(sender) == [1]
    for got in loaded:
        assert all(torch.equal(got[n], moved[n]) for n in moved)


def test_a_snapshot_overwritten_since_is_refused_and_nothing_loads(group):
    publisher, sender, receivers = group
    for version in (1, 2, 3):  # version 3 went into the buffer that held 1
        publisher.publish(((n, t + version) for n, t in WEIGHTS.items()), version)
    reports, loaded = _refresh(receivers, 1)
    assert all(isinstance(r, RefreshError) and "held version 3" in str(r) for r in reports) and loaded == [{}, {}]
    assert [r.version for r in receivers] == [0, 0] and _sent(sender) == [3]


def test_a_publish_into_the_buffer_being_sent_waits_for_the_send(group):
    publisher, sender, receivers = group
    publisher.publish(((n, t + 1) for n, t in WEIGHTS.items()), 1)
    with publisher.lock(3):  # as the sender holds it while it sends buffer 1
        done = threading.Event()
        threading.Thread(target=lambda: (publisher.publish(WEIGHTS.items(), 3), done.set()), daemon=True).start()
        assert not done.wait(0.5)  # version 3 goes into buffer 1: it waits
        publisher.publish(((n, t + 2) for n, t in WEIGHTS.items()), 2)  # buffer 0 is free
    assert done.wait(10) and publisher.version == 3
