"""The generator actor in a real proc: a refresh whose load fails part way never serves the mix."""

from __future__ import annotations

import pytest
from monarch.actor import ActorError

from forge_nb.actors.generator import GeneratorSpec
from forge_nb.engines.base import SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.launch.local import LocalMesh
from forge_nb.models import BUNDLED_MODEL
from forge_nb.runtime.calls import wait
from forge_nb.weights.manifest import checksum
from forge_nb.weights.publish import WeightPublisher
from tests.actors.tearing import TearingGenerator
from tests.conftest import wait_no_children
from tests.weights.shm_manifest import shm_manifest

GREEDY = SamplingParams(temperature=0.0, max_tokens=4)


@pytest.fixture
def generator():
    """A TearingGenerator on the bundled model in its own proc, attached to a publisher of that model's
    weights (this process: the trainer's side) -> (actor, publisher, the weights published, their manifest)."""
    weights = {n: t.clone() for n, t in TorchEngine.load(BUNDLED_MODEL).named_weights()}
    publisher = WeightPublisher(weights.items(), version=0)
    manifest = shm_manifest(publisher)
    mesh = LocalMesh()
    try:
        actor = mesh.spawn("generator", TearingGenerator, GeneratorSpec(str(BUNDLED_MODEL), "float32", 1))
        assert wait(actor.attach.call_one([manifest], "shm")) == "shm"
        yield actor, publisher, weights, manifest
    finally:
        mesh.stop()
        publisher.unlink()
    assert wait_no_children() == []


def test_a_load_that_fails_part_way_is_reported_and_nothing_is_sampled_until_a_whole_version_loads(generator, tmp_path):
    actor, publisher, weights, manifest = generator
    before = wait(actor.generate.call_one(["5+5="], GREEDY)).completions[0][0].token_ids
    publisher.publish([(n, t + 0.01) for n, t in weights.items()], version=1)
    wait(actor.tear_next_load.call_one())
    torn = r"generator \(pid \d+\): loading v1 over v0 failed part way \(RuntimeError: vLLM rank 1 is gone\).*replaces"
    with pytest.raises(ActorError, match=torn):
        wait(actor.refresh.call_one(1))
    refused = (
        lambda: actor.generate.call_one(["5+5="], GREEDY),
        lambda: actor.logprobs.call_one([[1, 2]], [[3]]),
        lambda: actor.checksum.call_one(),
        lambda: actor.save_weights.call_one(str(tmp_path / "served")),
    )
    for call in refused:
        with pytest.raises(ActorError, match=torn):
            wait(call())
    assert not (tmp_path / "served").exists()
    assert wait(actor.attach.call_one([manifest], "shm")) == "shm"  # attached again (a trainer restored): still torn
    with pytest.raises(ActorError, match=torn):
        wait(actor.generate.call_one(["5+5="], GREEDY))
    assert wait(actor.served.call_one()) == 0  # (what it served whole last; the mix is refused, not served)
    report = wait(actor.refresh.call_one(1))  # the same version again: a whole load this time
    assert (report.version, report.skipped) == (1, False)
    assert wait(actor.checksum.call_one()) == (1, checksum((n, t + 0.01) for n, t in weights.items()))
    publisher.publish(weights.items(), version=2)  # v0's weights again: the same greedy tokens as before
    wait(actor.refresh.call_one(2))
    assert wait(actor.generate.call_one(["5+5="], GREEDY)).completions[0][0].token_ids == before


def test_weights_that_do_not_fit_are_refused_before_any_group_or_load_and_the_replica_serves_on(generator):
    """`fits` (asked before a weights group forms) and `attach` refuse a trainer whose tensors do not fit the
    served model, and the replica goes on serving what it served."""
    actor, _, weights, manifest = generator
    name = next(iter(weights))
    misfit = WeightPublisher([(name, weights[name][:1])], version=0)  # one row of the embedding only
    try:
        refused = rf"WeightsRefused.*{name} is \(1, \d+\)"
        for call in (actor.fits.call_one, lambda m: actor.attach.call_one(m, "shm")):
            with pytest.raises(ActorError, match=refused):
                wait(call([shm_manifest(misfit)]))
        assert wait(actor.fits.call_one([manifest])) is None
        assert wait(actor.checksum.call_one()) == (0, checksum(weights.items()))
    finally:
        misfit.unlink()
