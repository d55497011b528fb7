"""What a supervised call raises when a proc's actor raised and lived (unit: no mesh)."""

from __future__ import annotations

import pytest
from monarch.actor import ActorError

from forge_nb.engines.base import WeightsRefused
from forge_nb.mesh.recovery import Supervised
from forge_nb.weights.refresh import RefreshError, TornWeights


class Calm(Supervised):
    """No role is dead: nothing to heal."""

    def heal(self) -> None:
        pass


def _raising(error: BaseException):
    def call():
        raise ActorError(error)

    return call


@pytest.mark.parametrize("error", [TornWeights("torn"), RefreshError("overwritten"), WeightsRefused("misfit")])
def test_a_refresh_error_reaches_the_user_as_itself_not_wrapped_by_monarch(error):
    with pytest.raises(type(error), match=str(error)) as raised:
        Calm()._supervised("generator", _raising(error))
    assert isinstance(raised.value.__cause__, ActorError)  # %tb still shows the remote traceback


def test_any_other_error_of_an_actor_stays_monarchs():
    with pytest.raises(ActorError, match="ValueError: a bug"):
        Calm()._supervised("generator", _raising(ValueError("a bug")))
