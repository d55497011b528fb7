"""Checks live code must pass before it gets a version: run it on a probe batch, with a timeout.

A reward must return a finite real number for every probe sample (a batched reward: a list of them,
one per sample); a loss must return a finite scalar tensor that requires grad, whose backward
succeeds with finite gradients. The same checks
guard the actors at run time (`check_reward_value`, `check_loss_value`).
"""

from __future__ import annotations

import math
import numbers
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from forge_nb.live.deadline import wait_for
from forge_nb.rewards.batch import RewardBatch, RewardSample, columns_of
from forge_nb.rewards.forms import by_name, is_batched, keywords_for
from forge_nb.rewards.judge_client import JudgeUnavailable
from forge_nb.rl.train_step import takes_ref


class CheckFailed(Exception):
    """One check failed; the message says what was wrong (the caller adds which code and version)."""


class CheckTimedOut(CheckFailed):
    """The code ran past its timeout; it may still be running where it was called."""


@dataclass(frozen=True)
class LossProbe:
    """Per-token tensors of real recent samples: [B, T] (advantages [B]), as the trainer passes them."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None  # passed to losses that take it


def run_with_timeout(fn: Callable[[], Any], timeout: float | None) -> Any:
    """Run `fn` in a daemon thread; raise `CheckFailed` if it raises, `CheckTimedOut` if it uses more
    than `timeout` s of its own (time waiting on a judge actor does not count: `live.deadline`).
    A judge that cannot answer raises `JudgeUnavailable`, for the caller to start or replace it.

    A Python thread cannot be killed: one that hangs is left running in the background, detached.
    """
    result: dict[str, Any] = {}
    done = threading.Event()

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # the code under test may raise anything, SystemExit included
            result["error"] = e
        finally:
            done.set()

    threading.Thread(target=target, name="forge_nb-live-check", daemon=True).start()
    if not wait_for(done, timeout):
        raise CheckTimedOut(f"did not return within the {timeout:g} s timeout (hangs?)")
    if isinstance(result.get("error"), CheckFailed | JudgeUnavailable):
        raise result["error"]
    if "error" in result:
        raise CheckFailed(describe_exception(result["error"]))
    return result.get("value")


def describe_exception(e: BaseException) -> str:
    """'raised ZeroDivisionError: division by zero (line 4)' -- the innermost line of live code."""
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "forge_nb/" not in f.filename]
    where = f" (line {frames[-1].lineno})" if frames else ""
    return f"raised {type(e).__name__}: {e}{where}"


def check_reward_value(value: Any) -> float:
    """The reward value as a float, or `CheckFailed` saying why it is not one."""
    if isinstance(value, torch.Tensor) and value.numel() == 1:
        value = value.item()
    if not isinstance(value, numbers.Real):
        raise CheckFailed(f"returned {type(value).__name__} {_short(value)}; expected a float")
    value = float(value)
    if not math.isfinite(value):
        raise CheckFailed(f"returned {value}; expected a finite float")
    return value


def batch_values(values: Any, size: int) -> list:
    """A batched reward's output as one entry per sample: a float, or the `CheckFailed` of that
    sample's value. Anything but a sequence of `size` values is a `CheckFailed` for the whole batch."""
    if isinstance(values, torch.Tensor | np.ndarray):
        values = values.tolist() if values.ndim == 1 else values
    if not isinstance(values, list | tuple) or len(values) != size:
        got = f"{len(values)} values" if isinstance(values, list | tuple) else f"{type(values).__name__}"
        raise CheckFailed(f"returned {got} {_short(values)}; expected a list of {size} floats, one per sample")
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


def validate_reward(fn: Callable, samples: list[RewardSample], timeout: float | None) -> list[float]:
    """Rewards of every probe sample under `fn` (per-sample or batched) -> list of floats;
    `CheckFailed` names the first bad one."""
    if is_batched(fn):
        return run_with_timeout(lambda: _validate_batched(fn, samples), timeout)
    context, named = keywords_for(fn), by_name(fn)

    def score_all() -> list[float]:
        values = []
        for i, p in enumerate(samples):
            try:
                values.append(call_reward(fn, p, context, named))
            except CheckFailed as e:
                raise CheckFailed(f"{e} {_where(i, p)}") from None
            except JudgeUnavailable:
                raise
            except Exception as e:
                raise CheckFailed(f"{describe_exception(e)} on probe sample {i} (prompt {_tail(p.prompt)!r})") from e
        return values

    return run_with_timeout(score_all, timeout)


def _validate_batched(fn: Callable, samples: list[RewardSample]) -> list[float]:
    try:
        out = fn(**keywords_for(fn)(columns_of(samples)))
    except (CheckFailed, JudgeUnavailable):
        raise
    except Exception as e:
        raise CheckFailed(f"{describe_exception(e)} on the probe batch of {len(samples)} samples") from e
    values = batch_values(out, len(samples))
    for i, value in enumerate(values):
        if isinstance(value, CheckFailed):
            raise CheckFailed(f"{value} {_where(i, samples[i])}")
    return values


def _where(i: int, sample: RewardSample) -> str:
    return f"for probe sample {i} (prompt {_tail(sample.prompt)!r}, completion {_short(sample.completion)!r})"


def check_loss_value(loss: Any) -> torch.Tensor:
    """`loss` if it is a finite scalar tensor that requires grad, else `CheckFailed`."""
    if not isinstance(loss, torch.Tensor):
        raise CheckFailed(f"returned {type(loss).__name__} {_short(loss)}; expected a scalar torch.Tensor")
    if loss.dim() != 0:
        raise CheckFailed(f"returned a tensor of shape {tuple(loss.shape)}; expected a scalar (shape ())")
    if not loss.requires_grad:
        raise CheckFailed("returned a tensor that does not require grad (detached, or built from old_logprobs only)")
    if not torch.isfinite(loss):
        raise CheckFailed(f"returned {loss.item()}; expected a finite value")
    return loss


def validate_loss(fn: Callable, probe: LossProbe, timeout: float) -> float:
    """Forward and backward of `fn` on `probe` -> the loss value; `CheckFailed` on any problem."""

    def forward_backward() -> float:
        logprobs = probe.logprobs.clone().requires_grad_(True)
        try:
            extra = {"ref_logprobs": probe.ref_logprobs.clone()} if takes_ref(fn) else {}
            loss = fn(logprobs, probe.old_logprobs.clone(), probe.advantages.clone(), probe.mask.clone(), **extra)
        except Exception as e:
            raise CheckFailed(describe_exception(e)) from e
        loss = check_loss_value(loss)
        try:
            loss.backward()
        except Exception as e:
            raise CheckFailed(f"backward {describe_exception(e)}") from e
        if logprobs.grad is None:
            raise CheckFailed("the loss does not depend on logprobs (no gradient reaches the policy)")
        if not torch.isfinite(logprobs.grad).all():
            raise CheckFailed("backward produced non-finite gradients")
        return loss.item()

    return run_with_timeout(forward_backward, timeout)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _tail(text: str, most: int = 60) -> str:
    """The end of a prompt (where a chat-templated prompt has the question)."""
    return text if len(text) <= most else "..." + text[-(most - 3) :]
