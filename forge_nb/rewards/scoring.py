"""Scoring samples with the live reward set, as the reward actors do every step: each member called
per sample or once on the batch (`rewards.forms`), its values checked, and every failure kept per
sample instead of raised, so one bad sample or member does not lose the batch.
"""

from __future__ import annotations

import math
import numbers
import sys
from collections.abc import Callable
from typing import Any

import numpy as np

from forge_nb.checks import CheckFailed, describe_exception, short_repr
from forge_nb.rewards.batch import RewardBatch, RewardSample, columns_of
from forge_nb.rewards.forms import by_name, is_batched, keywords_for
from forge_nb.rewards.judge_client import JudgeUnavailable


def _is_tensor(value: Any) -> bool:
    """A torch tensor. torch is not imported for this: a reward proc runs plain Python, and a reward that
    returns a tensor has imported torch."""
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.Tensor)


def check_reward_value(value: Any) -> float:
    """The reward value as a float, or `CheckFailed` saying why it is not one."""
    if _is_tensor(value) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise CheckFailed(f"returned {type(value).__name__} {short_repr(value)}; expected a float")
    value = float(value)
    if not math.isfinite(value):
        raise CheckFailed(f"returned {value}; expected a finite float")
    return value


def batch_values(values: Any, size: int) -> list:
    """A batched reward's output as one entry per sample: a float, or the `CheckFailed` of that
    sample's value. Anything but a sequence of `size` values is a `CheckFailed` for the whole batch."""
    if isinstance(values, np.ndarray) or _is_tensor(values):
        values = values.tolist() if values.ndim == 1 else values
    if not isinstance(values, list | tuple) or len(values) != size:
        got = f"{len(values)} values" if isinstance(values, list | tuple) else f"{type(values).__name__}"
        raise CheckFailed(f"returned {got} {short_repr(values)}; expected a list of {size} floats, one per sample")
    out: list = []
    for value in values:
        try:
            out.append(None if value is None else check_reward_value(value))  # None: no score (TRL's convention)
        except CheckFailed as e:
            out.append(e)
    return out


def call_reward(fn: Callable, sample: RewardSample, context: Callable[[dict], dict], named: bool = False) -> float:
    """`fn` on one sample, its value checked (`CheckFailed` if it is not a finite real number);
    `named`: the sample's fields go by keyword too (`forms.by_name`)."""
    if named:
        fields = {"prompt": sample.prompt, "completion": sample.completion, "target": sample.target}
        return check_reward_value(fn(**context({**sample.context, **fields})))
    return check_reward_value(fn(sample.prompt, sample.completion, sample.target, **context(sample.context)))


def score_each(
    fn: Callable, samples: list[RewardSample], values: list, errors: dict[int, str], judges: dict[str, str]
) -> None:
    """Score every sample with per-sample `fn`, writing `values[i]` (a float) or `errors[i]` (why
    not) as it goes, so a caller that gives up on a hung reward still sees what was done; judges that
    could not answer go into `judges` (model -> problem)."""
    context, named = keywords_for(fn), by_name(fn)
    for i, sample in enumerate(samples):
        try:
            values[i] = call_reward(fn, sample, context, named)
        except CheckFailed as e:
            errors[i] = str(e)
        except JudgeUnavailable as e:
            errors[i], judges[e.model] = str(e), e.problem
        except Exception as e:
            errors[i] = describe_exception(e)


def score_batched(
    fn: Callable, columns: dict[str, list], values: list, errors: dict[int, str], judges: dict[str, str]
) -> None:
    """Score a whole batch with batched `fn` (one call with the batch's `columns`), as `score_each`."""
    size = len(columns["completions"])
    try:
        out = batch_values(fn(**keywords_for(fn)(columns)), size)
    except JudgeUnavailable as e:
        errors.update(dict.fromkeys(range(size), str(e)))
        judges[e.model] = e.problem
        return
    except CheckFailed as e:
        errors.update(dict.fromkeys(range(size), str(e)))
        return
    except Exception as e:
        errors.update(dict.fromkeys(range(size), describe_exception(e)))
        return
    for i, value in enumerate(out):
        if isinstance(value, CheckFailed):
            errors[i] = str(value)
        else:
            values[i] = value


def score_members(
    fns: dict[str, Callable],
    batch: RewardBatch | list[RewardSample],
    components: dict[str, list],
    errors: dict[int, str],
) -> dict[str, str]:
    """Score every sample with every named member (per-sample or batched) into `components[name][i]`;
    `errors[i]` names the first member that failed on sample i (just the cause when there is one
    member). Writes as it goes, like `score_each` -> the judges that could not answer (model ->
    problem)."""
    judges: dict[str, str] = {}
    samples, columns = (batch, None) if isinstance(batch, list) else (None, None)
    for name, fn in fns.items():
        failed: dict[int, str] = {}
        if is_batched(fn):
            if columns is None:
                columns = columns_of(samples) if samples is not None else batch.columns()
            score_batched(fn, columns, components[name], failed, judges)
        else:
            if samples is None:
                samples = list(batch.samples())
            score_each(fn, samples, components[name], failed, judges)
        for i, why in failed.items():
            errors.setdefault(i, f"{name}: {why}" if len(fns) > 1 else why)
    return judges
