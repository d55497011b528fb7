"""Weak verifiers for the bundled tasks: cheap checks that never read the label.

A verifier votes on one sample: 1.0 (looks correct), 0.0 (looks wrong) or None (cannot tell). Each
one alone is a poor reward -- a format check passes wrong sums, a last-digit check passes one wrong
answer in ten -- but they err in different places, so an `Ensemble` that learns how far to trust each
one (`rewards.weaver`) is a good one. Per-sample verifiers are ``verifier(prompt, completion)``;
`agreement` is batched (``completions``: `rewards.forms`) because it compares a prompt's samples.

- `addition_verifiers()`: the bundled addition task ("47+385=" -> "432"): format, digit count,
  last digit, casting out nines, magnitude, agreement.
- `numeric_verifiers()`: questions with a numeric answer (`tasks.word_problems`, GSM8K-like data):
  number only, whole number, made from the question's numbers, not a number of the question, agreement.
"""

from __future__ import annotations

import itertools
import math
import re
from collections import Counter
from collections.abc import Callable
from functools import lru_cache

from forge_nb.rewards.answers import extract_answer, to_number
from forge_nb.rewards.prompt_text import as_text, numbers_in, question_of

Vote = float | None

_SUM = re.compile(r"(\d+)\s*\+\s*(\d+)\s*=\s*$")
_CANONICAL_INT = re.compile(r"0|[1-9]\d*")
_NUMBER_ONLY = re.compile(r"\$?-?\d[\d,]*(?:\.\d+)?\.?")


@lru_cache(maxsize=4096)
def _operands(prompt: str) -> tuple[int, int] | None:
    found = _SUM.search(question_of(prompt))
    return (int(found.group(1)), int(found.group(2))) if found else None


def _sum_answer(completion: str) -> int | None:
    text = completion.strip()
    return int(text) if text.isdigit() else None


# -- the addition task ------------------------------------------------------------------------------


def digits_only(prompt: str, completion: str) -> Vote:
    """Format: the completion is a plain non-negative integer, no leading zeros, nothing else."""
    return float(_CANONICAL_INT.fullmatch(completion.strip()) is not None)


def digit_count(prompt: str, completion: str) -> Vote:
    """Heuristic: a sum has as many digits as the longer operand, or one more."""
    operands, answer = _operands(prompt), _sum_answer(completion)
    if operands is None:
        return None
    longest = len(str(max(operands)))
    return float(answer is not None and len(str(answer)) in (longest, longest + 1))


def last_digit(prompt: str, completion: str) -> Vote:
    """Partial numeric check: the last digit of the answer is that of the sum of the operands' last digits."""
    operands, answer = _operands(prompt), _sum_answer(completion)
    if operands is None:
        return None
    return float(answer is not None and answer % 10 == (operands[0] % 10 + operands[1] % 10) % 10)


def casting_out_nines(prompt: str, completion: str) -> Vote:
    """Partial numeric check: the answer's digit sum agrees with the operands' modulo 9."""
    operands, answer = _operands(prompt), _sum_answer(completion)
    if operands is None:
        return None
    return float(answer is not None and answer % 9 == (operands[0] % 9 + operands[1] % 9) % 9)


def magnitude(prompt: str, completion: str) -> Vote:
    """Heuristic bound: a sum of non-negative numbers is at least the larger one and at most twice it."""
    operands, answer = _operands(prompt), _sum_answer(completion)
    if operands is None:
        return None
    return float(answer is not None and max(operands) <= answer <= 2 * max(operands))


# -- numeric answers to questions ----------------------------------------------------------------


def _final(completion: str) -> float | None:
    return to_number(extract_answer(completion))


def number_only(prompt: str, completion: str) -> Vote:
    """Format: the completion is just a number (what "answer with the final number only" asks)."""
    return float(_NUMBER_ONLY.fullmatch(completion.strip()) is not None)


def whole_number(prompt: str, completion: str) -> Vote:
    """Heuristic: counting questions have non-negative whole answers."""
    value = _final(completion)
    return float(value is not None and value >= 0 and value == int(value))


_OPS = (
    lambda x, y: x + y,
    lambda x, y: x - y,
    lambda x, y: x * y,
    lambda x, y: x / y if y else math.nan,
)


@lru_cache(maxsize=4096)
def _reachable(prompt: str) -> frozenset[float]:
    """Values one or two arithmetic steps make from the question's numbers (its first four)."""
    numbers = list(enumerate(numbers_in(question_of(prompt))[:4]))
    steps = {(i, j): [op(x, y) for op in _OPS] for (i, x), (j, y) in itertools.permutations(numbers, 2)}
    values = {v for found in steps.values() for v in found}
    for (i, j), found in steps.items():
        for k, z in numbers:
            if k not in (i, j):
                values |= {op(a, z) for a in found for op in _OPS} | {op(z, a) for a in found for op in _OPS}
    return frozenset(round(v, 6) for v in values if math.isfinite(v))


def from_operands(prompt: str, completion: str) -> Vote:
    """Partial numeric check: the answer is one or two +, -, x, / steps from the question's numbers."""
    value = _final(completion)
    if len(numbers_in(question_of(prompt))) < 2:
        return None
    return float(value is not None and round(value, 6) in _reachable(prompt))


def not_an_operand(prompt: str, completion: str) -> Vote:
    """Heuristic: an answer that only repeats a number of the question is usually wrong."""
    value = _final(completion)
    numbers = numbers_in(question_of(prompt))
    if not numbers:
        return None
    return float(value is not None and value not in numbers)


# -- any task -----------------------------------------------------------------------------------


def agreement(prompts: list[str], completions: list[str], prompt_id: list | None = None) -> list[Vote]:
    """Self-consistency: 1.0 when a sample's final answer is its prompt's most common one among the
    batch's samples of that prompt (and at least two agree), 0.0 otherwise; None for a prompt
    sampled once."""
    keys = prompt_id if prompt_id is not None else [as_text(p) for p in prompts]
    answers = [_normal_answer(as_text(c)) for c in completions]
    groups: dict = {}
    for key, answer in zip(keys, answers):
        groups.setdefault(key, Counter())[answer] += 1
    top = {key: _most_common(counts) for key, counts in groups.items()}
    return [
        None if groups[key].total() < 2 else float(answer is not None and answer == top[key])
        for key, answer in zip(keys, answers)
    ]


def _most_common(counts: Counter) -> str | float | None:
    """The answer most of a prompt's samples gave, if two or more gave it and no other answer ties; else None."""
    (answer, n), *rest = counts.most_common(2) + [(None, 0)]
    return answer if n >= 2 and rest[0][1] < n else None


def _normal_answer(completion: str) -> str | float | None:
    text = extract_answer(completion)
    number = to_number(text)
    return number if number is not None else (" ".join(text.lower().split()) or None)


def addition_verifiers() -> list[Callable]:
    """The weak verifiers of the bundled addition task."""
    return [digits_only, digit_count, last_digit, casting_out_nines, magnitude, agreement]


def numeric_verifiers() -> list[Callable]:
    """Weak verifiers for questions whose answer is a number (word problems, GSM8K-like data)."""
    return [number_only, whole_number, from_operands, not_an_operand, agreement]
