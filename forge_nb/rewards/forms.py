"""The two forms a reward (or a weak verifier) can take, and which keywords each one is called with.

Per sample: ``reward(prompt, completion, target, **context) -> float``, called once per sample.

Batched (TRL's form): any function with a parameter called ``completions`` or ``completion_ids``. It
is called once per batch with the batch's columns as keywords, as TRL's GRPOTrainer calls a reward
(`rewards.trl_form`) -- ``prompts``, ``completions``, ``completion_ids``, ``trainer_state``, ``targets``,
and one list per context column under that column's name (``step``, ``policy_version``,
``sample_id``, ``prompt_id`` and the dataset's own columns) -- and returns one float per sample, or
None for a sample it gives no score. A model judge
scores a whole batch in a few forward passes; a weak-verifier ensemble fits over the whole batch.

Either may be an ``async def`` (as TRL allows): it is run to completion where it is called
(`live.capture.synchronous`).

Both forms get only the keywords they name, or every one with ``**kwargs``. A per-sample reward that
names any of ``prompt``, ``completion``, ``target`` gets those by name as well, so it takes only what it
uses (``def brief(completion)``); one that names none of them (``def r(p, c, t)``) gets the three
positionally.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

#: A parameter with one of these names makes a reward batched (TRL's rewards take one or the other).
BATCHED_MARKS = ("completions", "completion_ids")


def parameters(fn: Callable) -> list[inspect.Parameter] | None:
    """`fn`'s parameters (a callable object's ``__call__`` without ``self``), or None if unknown."""
    try:
        return list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None


def is_batched(fn: Callable) -> bool:
    """Whether `fn` takes the batch's columns at once (it has a parameter called ``completions`` or
    ``completion_ids``)."""
    params = parameters(fn)
    return params is not None and any(p.name in BATCHED_MARKS for p in params)


SAMPLE_FIELDS = ("prompt", "completion", "target")


def by_name(fn: Callable) -> bool:
    """Whether per-sample `fn` is called with keywords only (it names a sample field and takes no
    positional-only or ``*args`` parameter), else ``fn(prompt, completion, target, **context)``."""
    params = parameters(fn)
    if params is None or any(p.kind in (p.POSITIONAL_ONLY, p.VAR_POSITIONAL) for p in params):
        return False
    return any(p.name in SAMPLE_FIELDS for p in params)


def keywords_for(fn: Callable) -> Callable[[dict], dict]:
    """Which of the available keywords `fn` takes: all of them when it has ``**kwargs``, else only
    the ones it names (so ``def reward(prompt, completion, target)`` works too)."""
    params = parameters(fn)
    if params is None or any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda values: values
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return lambda values: {k: v for k, v in values.items() if k in named}
