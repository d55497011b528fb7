"""Answer checks for rewards: pull the final answer out of a completion and compare it with the target.

Plain functions, usable from a reward cell::

    from forge_nb.rewards import answer_match, format_match

    def reward(prompt, completion, target, **context):
        return answer_match(completion, target)

A `\\boxed{...}` answer wins; otherwise the last number in the text. Numbers compare as numbers
("1,234" == "1234.0"; "$12" == "12"; "50%" == "50"), anything else as normalised text.
"""

from __future__ import annotations

import math
import re

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?|-?\.\d+")


def boxed(text: str) -> str | None:
    """The content of the last ``\\boxed{...}`` in `text` (nested braces allowed), or None."""
    start = text.rfind("\\boxed{")
    if start < 0:
        return None
    depth, i = 1, start + len("\\boxed{")
    for j in range(i, len(text)):
        depth += {"{": 1, "}": -1}.get(text[j], 0)
        if depth == 0:
            return text[i:j].strip()
    return None


def last_number(text: str) -> float | None:
    """The last number written in `text` ("1,234.5", "-3", ".5"), or None."""
    found = _NUMBER.findall(text)
    return to_number(found[-1]) if found else None


def to_number(text: str) -> float | None:
    """`text` as a number if it is one ("$1,234", "12.0", "50%", "-7"), else None."""
    cleaned = text.strip().strip("$").rstrip("%").replace(",", "").strip()
    try:
        value = float(cleaned)
    except ValueError:
        return None
    return value if math.isfinite(value) else None


def extract_answer(completion: str) -> str:
    """The completion's final answer as text: a boxed answer, else the last number, else the
    completion itself (stripped)."""
    inside = boxed(completion)
    if inside is not None:
        return inside
    found = _NUMBER.findall(completion)
    return found[-1] if found else completion.strip()


def answer_match(completion: str, target: str, rel_tol: float = 1e-6) -> float:
    """1.0 when the completion's final answer equals `target` (as numbers when both are numbers,
    else as text, case and surrounding punctuation ignored), else 0.0."""
    answer = extract_answer(completion)
    want, got = to_number(target), to_number(answer)
    if want is not None and got is not None:
        return float(math.isclose(want, got, rel_tol=rel_tol, abs_tol=1e-9))
    return float(_normal(answer) == _normal(target))


def format_match(completion: str, pattern: str) -> float:
    """1.0 when the whole completion (stripped) matches the regular expression `pattern`, else 0.0."""
    return float(re.fullmatch(pattern, completion.strip(), flags=re.DOTALL) is not None)


def _normal(text: str) -> str:
    return " ".join(text.strip().strip(".!?;:'\"").lower().split())
