"""Seeded arithmetic word problems as chat-message rows, for training a real instruct model.

``word_problems(n, seed)`` -> rows ``{"prompt": [{"role": "user", "content": ...}], "answer": "42",
"kind": "add"}``, ready for ``forge_nb.up(task=rows)``. One- and two-step problems (add, subtract,
multiply, share equally, add-then-give-away) whose numbers stay up to `top` (40 by default; 9 makes
one-digit problems); the answer is always a non-negative integer. The same seed gives the same rows.
"""

from __future__ import annotations

import random

NAMES = ("Ana", "Ben", "Chen", "Dara", "Eli", "Fatima", "Gus", "Hana", "Ivan", "Jo", "Kofi", "Lena", "Mateo", "Nia")
ITEMS = ("apples", "marbles", "stickers", "books", "coins", "pencils", "cookies", "shells", "cards", "stamps")
INSTRUCTION = "Answer with the final number only."


def _add(r: random.Random, name: str, item: str, top: int) -> tuple[str, int]:
    a, b = r.randint(2, top), r.randint(2, top)
    return f"{name} has {a} {item}. {name} gets {b} more. How many {item} does {name} have now?", a + b


def _subtract(r: random.Random, name: str, item: str, top: int) -> tuple[str, int]:
    a = r.randint(3, max(3, top))
    b = r.randint(1, a - 1)
    return f"{name} had {a} {item} and gave {b} of them away. How many {item} does {name} have left?", a - b


def _multiply(r: random.Random, name: str, item: str, top: int) -> tuple[str, int]:
    a, b = r.randint(2, min(9, top)), r.randint(2, min(9, top))
    return f"{name} has {a} bags with {b} {item} in each bag. How many {item} does {name} have in all?", a * b


def _share(r: random.Random, name: str, item: str, top: int) -> tuple[str, int]:
    each, friends = r.randint(2, min(9, top)), r.randint(2, min(6, top))
    return (
        f"{name} shares {each * friends} {item} equally among {friends} friends. How many {item} does each friend get?",
        each,
    )


def _two_step(r: random.Random, name: str, item: str, top: int) -> tuple[str, int]:
    a, b = r.randint(2, max(2, top)), r.randint(2, max(2, top // 2))
    c = r.randint(1, a + b - 1)
    question = (
        f"{name} has {a} {item}, buys {b} more, then gives {c} to a friend. How many {item} does {name} have now?"
    )
    return question, a + b - c


KINDS = {"add": _add, "subtract": _subtract, "multiply": _multiply, "share": _share, "two_step": _two_step}


def word_problems(n: int, seed: int = 0, kinds: tuple[str, ...] = tuple(KINDS), top: int = 40) -> list[dict]:
    """`n` distinct problems (kinds in turn, numbers up to `top`), seeded."""
    r, rows, seen = random.Random(f"word-problems-{seed}"), [], set()
    while len(rows) < n:
        kind = kinds[len(rows) % len(kinds)]
        question, answer = KINDS[kind](r, r.choice(NAMES), r.choice(ITEMS), top)
        if question in seen:
            continue
        seen.add(question)
        content = f"{question} {INSTRUCTION}"
        rows.append({"prompt": [{"role": "user", "content": content}], "answer": str(answer), "kind": kind})
    return rows
