"""Bundled agent task: guess the number, with "higher" / "lower" feedback, as an environment.

`GuessTheNumber` is driven by the runner (``env=GuessTheNumber``): ``reset(row)`` states the game,
``step(reply)`` reads the last whole number in the reply and answers "Higher." / "Lower." (reward 0)
or "Correct!" (reward 1, done). A reply with no number is told how to answer (reward 0). The number
of guesses is bounded by the runner's `Limits.max_turns`.
"""

from __future__ import annotations

import random
import re

NUMBER = re.compile(r"-?\d+")


class GuessTheNumber:
    """Guess a whole number in [`low`, `high`]; the row's "target" (or one drawn from its "seed")."""

    def __init__(self, low: int = 1, high: int = 20) -> None:
        self.low, self.high = low, high
        self.target: int | None = None
        self.guesses: list[int] = []

    def reset(self, row: dict) -> str:
        """Start a game -> the opening user message."""
        if "target" in row:
            self.target = int(row["target"])
        else:
            self.target = random.Random(f"guess-{row.get('seed', 0)}").randint(self.low, self.high)
        self.guesses = []
        return (
            f"I am thinking of a whole number between {self.low} and {self.high}. Guess it. "
            "After each guess I say 'Higher.' or 'Lower.'. Reply with one number only."
        )

    def step(self, action: str) -> tuple[str, float, bool]:
        """The model's reply -> (feedback, reward, done)."""
        numbers = NUMBER.findall(action)
        if not numbers:
            return f"Reply with one whole number between {self.low} and {self.high}.", 0.0, False
        guess = int(numbers[-1])
        self.guesses.append(guess)
        if guess == self.target:
            return f"Correct! The number was {self.target}.", 1.0, True
        return ("Higher." if guess < self.target else "Lower."), 0.0, False


def guess_number_rows(n: int, seed: int = 0, low: int = 1, high: int = 20) -> list[dict]:
    """`n` games with seeded targets: ``{"prompt_id": "guess-0-3", "target": 7}``."""
    r = random.Random(f"guess-number-{seed}")
    return [{"prompt_id": f"guess-{seed}-{i}", "target": r.randint(low, high)} for i in range(n)]
