"""Weight refresh between real actors: every transport, replicas, and refresh during training."""

import threading

import pytest

from forge_nb.rl.batch import TrainBatch
from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from tests.conftest import wait_no_children

SMALL = {"prompts_per_step": 4, "group_size": 4, "threads_per_proc": 1}


@pytest.fixture
def up():
    sessions = []

    def start(**overrides):
        sessions.append(Session.up(**SMALL, **overrides))
        return sessions[-1]

    yield start
    for s in sessions:
        s.down()
    assert wait_no_children() == []


@pytest.mark.parametrize("transport", ["rdma", "tcp", "group"])
def test_two_trainer_ranks_to_two_generators_shard_direct_over_each_transport(up, transport):
    """Each trainer rank publishes its own shards; both generator replicas (own procs, refreshed in
    parallel) read both ranks and serve whole tensors equal to the trainer's, bit for bit, after every
    refresh. (shm, the local default: tests/parallel/test_gang_session.py has the same shape; one trainer
    proc: every other session of the suite.)"""
    s = up(transport=transport, trainer_procs=2, generator_procs=2)
    assert s.status()["weights_transport"] == transport and len(set(s.pids["generator"])) == 2
    assert s.status()["trainer"]["refresh_bytes"] == report_bytes(s)
    for version in (1, 2):
        s.train(s.rollout())
        report = s.sync()
        assert (report["transport"], report["version"], report["replicas"]) == (transport, version, 2)
        sums = s.checksums()
        assert [v for v, _ in sums["generator_replicas"]] == [version, version]
        assert {c for _, c in sums["generator_replicas"]} == {sums["trainer"][1]}


def report_bytes(s) -> int:
    """What one refresh of one replica moves: every trainer rank's snapshot."""
    return sum(i.details["refresh_bytes"] for i in s.fleet.info["trainer"])


@pytest.mark.parametrize("transport", ["shm", "rdma", "tcp"])
def test_generator_always_holds_exactly_one_published_version_while_the_trainer_steps(up, transport):
    s = up(transport=transport)
    rollout = s.rollout()
    batch = TrainBatch.of(rollout.episodes)
    trainer, generator = s.fleet.trainer, s.fleet.generator
    published = {0: wait(trainer.checksum.call_one())[1]}
    latest = [0]
    done = threading.Event()

    def trainer_loop():
        for _ in range(15):
            version = wait(trainer.train_batch.call_one(batch)).policy_version
            published[version] = wait(trainer.checksum.call_one())[1]
            latest[0] = version
        done.set()

    thread = threading.Thread(target=trainer_loop)
    thread.start()
    seen, refused = [], 0
    while not done.is_set():
        try:
            wait(generator.refresh.call_one(latest[0]))
        except Exception as e:  # the trainer got two versions ahead mid-read: refused, nothing loaded
            assert "nothing was loaded" in str(e)
            refused += 1
        version, digest = wait(generator.checksum.call_one())
        seen.append((version, digest))
    thread.join()
    for version, digest in seen:
        # the trainer publishes version v, then its checksum is recorded: wait for that to land
        assert published[version] == digest, f"generator v{version} is not the published v{version}"
    assert len({v for v, _ in seen}) >= 2, seen
