"""The task protocol: where prompts come from and how a completion is checked.

A task is pure Python (no Monarch, no torch) so it can be unit-tested in microseconds.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

#: A chat prompt: [{"role": "system" | "user" | "assistant", "content": str}, ...].
Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    `prompt` is a plain string (given to the model as it is) or chat messages (rendered with the
    tokenizer's chat template, see `tasks.prompts`). `prompt_id` is stable for a given task, seed
    and split, so samples can be traced back to it. `extras` are the dataset's other columns; each
    reaches the reward as a keyword argument.
    """

    prompt_id: str
    prompt: str | Messages
    target: str
    extras: dict = field(default_factory=dict)


class Task(Protocol):
    """What the session needs from a task."""

    name: str

    def sample(self, n: int) -> list[Problem]:
        """Next `n` training problems (the task holds its own seeded stream)."""
        ...

    def eval_set(self) -> list[Problem]:
        """The fixed held-out problems, disjoint from anything `sample` returns."""
        ...

    def known_problems(self) -> list[Problem]:
        """Every problem known up front, for checking prompt lengths before anything starts (a
        dataset's rows; a generated task's held-out set)."""
        ...

    def state(self) -> dict:
        """Where the training stream is (JSON-able): `load_state` of it continues from there."""
        ...

    def load_state(self, state: dict) -> None: ...

    def verify(self, completion: str, target: str) -> float:
        """Exact score of one completion in [0, 1] (the `accuracy` of rollouts and evaluations)."""
        ...
