"""The session's side of the "group" weights transport: what it asks, in which order (the groups
themselves, with real actors: tests/weights/test_refresh_mesh.py)."""

from __future__ import annotations

from types import SimpleNamespace
from unittest import mock

import pytest

from forge_nb.engines.base import WeightsRefused
from forge_nb.fleet.weight_sync import WeightSync
from forge_nb.versions import PolicyVersions


def test_a_replica_that_refuses_the_weights_fails_the_attach_before_any_group_forms():
    """Else the trainer ranks and the other replicas would wait in the group until `group_timeout_s`."""
    roles = SimpleNamespace(
        generator_procs=2,
        info={"trainer": [], "generator": []},
        trainer=mock.Mock(),
        generator=mock.Mock(),
    )
    config = SimpleNamespace(transport="group", group_timeout_s=60.0)
    roles.generator.fits.call.side_effect = WeightsRefused("the trainer's tensors do not fit the served model")
    with pytest.raises(WeightsRefused, match="do not fit"):
        WeightSync(roles, PolicyVersions(), config)._attach_group([])
    roles.trainer.weights_group.call.assert_not_called()
    roles.trainer.join_weights_group.call.assert_not_called()
