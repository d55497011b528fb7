"""What a failed check of live code raises, and how its message quotes the code's value or exception.

Its own module, importing nothing of forge_nb, because both sides raise these: the checks of candidate
code in the kernel (`live.validate`, which uses `rewards.scoring`) and the per-step scoring in the
reward actors (`rewards.scoring`, which must not import `live`: rewards sit below it).
"""

from __future__ import annotations

import traceback
from typing import Any


class CheckFailed(Exception):
    """One check failed; the message says what was wrong (the caller adds which code and version)."""


class CheckTimedOut(CheckFailed):
    """The code ran past its timeout; it may still be running where it was called."""


def describe_exception(e: BaseException) -> str:
    """'raised ZeroDivisionError: division by zero (line 4)' -- the innermost line of live code."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "forge_nb/" not in f.filename]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"raised {type(e).__name__}: {e}{where}"


def short_repr(value: Any) -> str:
    """`repr(value)`, cut to 40 characters, for a message that quotes what the code returned."""
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
