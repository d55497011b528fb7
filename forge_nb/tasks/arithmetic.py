"""Bundled task: multi-digit addition with an exact verifier.

Prompts look like ``"47+385="``; the target is the decimal sum (``"432"``). Operands have 1 to
`max_digits` digits. Held-out problems are drawn from a separate seeded stream and every problem
whose operand pair is in the held-out set is excluded from training, so the evaluation is clean.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from forge_nb.tasks.base import Problem

#: Every character a prompt or answer of this task can contain (the bundled tokenizer's alphabet).
ALPHABET = "0123456789+="


def _operand(rng: random.Random, max_digits: int) -> int:
    # Uniform over the digit count first, so short and long operands are equally common.
    digits = rng.randint(1, max_digits)
    low = 0 if digits == 1 else 10 ** (digits - 1)
    return rng.randint(low, 10**digits - 1)


def make_problem(a: int, b: int) -> Problem:
    return Problem(prompt_id=f"{a}+{b}", prompt=f"{a}+{b}=", target=str(a + b))


@dataclass
class Addition:
    """Addition of two integers of up to `max_digits` digits.

    `seed` fixes both the training stream and the held-out set; `eval_size` problems are held out.
    """

    max_digits: int = 2
    seed: int = 0
    eval_size: int = 200
    name: str = "addition"
    _rng: random.Random = field(init=False, repr=False)
    _held_out: list[Problem] = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_digits < 1:
            raise ValueError(f"task.max_digits must be >= 1, got {self.max_digits}")
        eval_rng = random.Random(f"{self.name}-eval-{self.seed}")
        seen: dict[str, Problem] = {}
        limit = (10**self.max_digits) ** 2 // 2
        while len(seen) < min(self.eval_size, limit):
            p = self._draw(eval_rng)
            seen.setdefault(p.prompt_id, p)
        self._held_out = list(seen.values())
        self._rng = random.Random(f"{self.name}-train-{self.seed}")

    def _draw(self, rng: random.Random) -> Problem:
        return make_problem(_operand(rng, self.max_digits), _operand(rng, self.max_digits))

    def sample(self, n: int) -> list[Problem]:
        held = {p.prompt_id for p in self._held_out}
        out: list[Problem] = []
        while len(out) < n:
            p = self._draw(self._rng)
            if p.prompt_id not in held:
                out.append(p)
        return out

    def eval_set(self) -> list[Problem]:
        return list(self._held_out)

    def known_problems(self) -> list[Problem]:
        return self.eval_set()

    def state(self) -> dict:
        """The training stream's random state (JSON-able)."""
        version, internal, gauss = self._rng.getstate()
        return {"rng": [version, list(internal), gauss]}

    def load_state(self, state: dict) -> None:
        version, internal, gauss = state["rng"]
        self._rng.setstate((version, tuple(internal), gauss))

    def verify(self, completion: str, target: str) -> float:
        return exact_match(completion, target)


def exact_match(completion: str, target: str) -> float:
    """1.0 when the completion, stripped of surrounding whitespace, equals the target; else 0.0."""
    return 1.0 if completion.strip() == target else 0.0
