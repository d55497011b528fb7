"""TRL's reward_funcs and reward_weights become the live reward set, named as TRL names them."""

from types import SimpleNamespace

import pytest

from forge_nb.config import Config
from forge_nb.live.capture import LiveCodeError
from forge_nb.rewards import set_reward_funcs

trl_rewards = pytest.importorskip("trl.rewards")


class FakeSession:
    """Records what `set_reward_funcs` asks of a session (no mesh needed)."""

    def __init__(self, **config) -> None:
        self.config = Config.from_dict(config)
        self.members, self.version = {"reward": 1.0}, 0

    def set_reward(self, fn=None, *, name=None, weight=None) -> int:
        self.members[name or "reward"] = weight
        self.version += 1
        return self.version

    def remove_reward(self, name: str) -> int:
        if name not in self.members:
            raise LiveCodeError(f"remove: no reward member {name!r}")
        del self.members[name]
        self.version += 1
        return self.version


def test_trl_reward_funcs_are_named_and_weighted_as_trl_does_and_replace_the_builtin():
    s = FakeSession()
    repetition = trl_rewards.get_repetition_penalty_reward()
    version = set_reward_funcs(s, [trl_rewards.accuracy_reward, repetition], [1.0, 0.5])
    assert s.members == {"accuracy_reward": 1.0, "repetition_penalty_reward": 0.5} and version == 3


def test_weights_come_from_the_config_when_not_given():
    s = FakeSession(reward_weights=[2.0, 0.25])  # up(reward_weights=...), TRL's name
    set_reward_funcs(s, [trl_rewards.think_format_reward, lambda completions, **kw: [0.0] * len(completions)])
    assert s.members == {"think_format_reward": 2.0, "lambda": 0.25}


def test_a_weight_per_function_or_a_clear_error():
    with pytest.raises(ValueError, match="2 reward weights for 1 reward functions"):
        set_reward_funcs(FakeSession(), [trl_rewards.think_format_reward], [1.0, 2.0])


def test_a_builtin_removed_before_is_fine():
    s = FakeSession()
    del s.members["reward"]
    set_reward_funcs(s, [trl_rewards.think_format_reward, SimpleNamespace(__call__=None, __name__="0 odd name")])
    assert set(s.members) == {"think_format_reward", "r_0_odd_name"}
