"""The task protocol: where prompts come from and how a completion is checked.

A task is pure Python (no Monarch, no torch) so it can be unit-tested in microseconds
and shipped to any actor by name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol


@dataclass(frozen=True)
class Problem:
    """One prompt with its reference answer.

    `prompt_id` is stable for a given task, seed and split, so samples can be traced back to it.
    """

    prompt_id: str
    prompt: str
    target: str


class Task(Protocol):
    """What the session needs from a task."""

    name: str

    def sample(self, n: int) -> list[Problem]:
        """Next `n` training problems (the task holds its own seeded stream)."""
        ...

    def eval_set(self) -> list[Problem]:
        """The fixed held-out problems, disjoint from anything `sample` returns."""
        ...

    def verify(self, completion: str, target: str) -> float:
        """Exact score of one completion in [0, 1]."""
        ...
