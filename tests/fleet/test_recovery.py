"""What a supervised call does when a proc's actor raised and lived (unit: no mesh, respawns recorded)."""

from __future__ import annotations

import pytest
from monarch.actor import ActorError

from forge_nb.engines.base import WeightsRefused
from forge_nb.fleet.recovery import Recovery
from forge_nb.weights.refresh import RefreshError, TornWeights


class Calm(Recovery):
    """No role is dead: nothing to heal; a respawn is recorded (a fleet that replaces nothing)."""

    def __init__(self) -> None:
        super().__init__(fleet=None)
        self.respawned = []

    def heal(self) -> None:
        pass

    def respawn(self, role: str, cause: str) -> None:
        self.respawned.append((role, cause))


def _raising(error: BaseException):
    def call():
        raise ActorError(error)

    return call


@pytest.mark.parametrize("role", ["generator", "env"])
def test_a_torn_generator_is_replaced_and_the_call_issued_again(role):
    """Torn weights from a generator (called by the kernel, or by an env proc: Monarch wraps it twice)."""
    calls = []

    def call():
        calls.append(1)
        if len(calls) == 1:
            torn = ActorError(TornWeights("generator (pid 7): loading v1 over v0 failed part way"))
            raise torn if role == "generator" else ActorError(torn)
        return "sampled"

    calm = Calm()
    assert calm.supervised(role, call) == "sampled" and len(calls) == 2
    assert [r for r, _ in calm.respawned] == ["generator"] and "loading v1 over v0" in calm.respawned[0][1]


@pytest.mark.parametrize("error", [RefreshError("overwritten"), WeightsRefused("misfit")])
def test_a_refresh_error_reaches_the_user_as_itself_not_wrapped_by_monarch(error):
    calm = Calm()
    with pytest.raises(type(error), match=str(error)) as raised:
        calm.supervised("generator", _raising(error))
    assert isinstance(raised.value.__cause__, ActorError)  # %tb still shows the remote traceback
    assert calm.respawned == []  # the served weights are whole: nothing to replace


def test_any_other_error_of_an_actor_stays_monarchs():
    with pytest.raises(ActorError, match="ValueError: a bug"):
        Calm().supervised("generator", _raising(ValueError("a bug")))
