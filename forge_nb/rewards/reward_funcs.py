"""TRL's ``reward_funcs`` list (with GRPOConfig's ``reward_weights``) as forge_nb's live rewards.

``GRPOTrainer(reward_funcs=[f, g], args=GRPOConfig(reward_weights=[1.0, 0.5]))`` trains on
``1.0 x f + 0.5 x g`` and logs each under its ``__name__``. `set_reward_funcs(s, [f, g])` makes the same
set live in a session: one member per function, named as TRL names it, weighted from `reward_weights`
(else the session's ``algorithm.reward_weights``, which ``up(reward_weights=...)`` sets, else 1 each), in
place of the built-in answer check. Each is validated like any reward (`Session.set_reward`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from typing import Any, Protocol

from forge_nb.live.capture import LiveCodeError


class RewardHost(Protocol):
    """What `set_reward_funcs` needs of a `forge_nb.Session`."""

    config: Any

    def set_reward(
        self, fn: Callable | None = None, *, name: str | None = None, weight: float | None = None
    ) -> int: ...

    def remove_reward(self, name: str) -> int: ...


BUILTIN = "reward"  # the member a session starts with: the task's answer check


def reward_func_name(fn: Callable, taken: set[str]) -> str:
    """TRL's name for a reward function (its ``__name__``, else its class's), made a unique identifier."""
    raw = getattr(fn, "__name__", None) or type(fn).__name__
    name = re.sub(r"\W", "_", raw).strip("_") or "reward_func"
    name = f"r_{name}" if name[0].isdigit() else name
    unique, k = name, 1
    while unique in taken:
        k += 1
        unique = f"{name}_{k}"
    return unique


def set_reward_funcs(
    session: RewardHost, reward_funcs: Sequence[Callable], reward_weights: Sequence[float] | None = None
) -> int:
    """Make `reward_funcs` the live reward set, as TRL weighs and names them -> the live reward version.
    A function that fails validation raises `LiveCodeError`; those set before it stay live."""
    if not reward_funcs:
        raise ValueError("set_reward_funcs: give at least one reward function")
    weights = list(reward_weights or session.config.algorithm.reward_weights or [1.0] * len(reward_funcs))
    if len(weights) != len(reward_funcs):
        raise ValueError(
            f"set_reward_funcs: {len(weights)} reward weights for {len(reward_funcs)} reward functions; "
            "give one weight per function (TRL's reward_weights)"
        )
    taken: set[str] = set()
    version = 0
    for fn, weight in zip(reward_funcs, weights):
        name = reward_func_name(fn, taken)
        taken.add(name)
        version = session.set_reward(fn, name=name, weight=float(weight))
    if BUILTIN not in taken:
        try:
            version = session.remove_reward(BUILTIN)
        except LiveCodeError:  # the built-in was removed before
            pass
    return version
