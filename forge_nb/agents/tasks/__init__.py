"""Bundled agent tasks: word problems with a calculator tool, and guess-the-number with feedback."""

from forge_nb.agents.tasks.calculator import (
    answer_reward,
    calculator,
    calculator_problems,
    calculator_rollout,
    expression_rollout,
)
from forge_nb.agents.tasks.guess_number import GuessTheNumber, guess_number_rows

__all__ = [
    "GuessTheNumber",
    "answer_reward",
    "calculator",
    "calculator_problems",
    "calculator_rollout",
    "expression_rollout",
    "guess_number_rows",
]
