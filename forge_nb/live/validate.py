"""Checks live code must pass before it gets a version: run it on a probe batch, with a timeout.

A reward must return a finite real number for every probe sample; a loss must return a finite
scalar tensor that requires grad, whose backward succeeds with finite gradients. The same checks
guard the actors at run time (`check_reward_value`, `check_loss_value`).
"""

from __future__ import annotations

import inspect
import math
import numbers
import threading
import traceback
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from forge_nb.rewards.batch import RewardSample
from forge_nb.rl.train_step import takes_ref


class CheckFailed(Exception):
    """One check failed; the message says what was wrong (the caller adds which code and version)."""


@dataclass(frozen=True)
class LossProbe:
    """Per-token tensors of real recent samples: [B, T] (advantages [B]), as the trainer passes them."""

    logprobs: torch.Tensor
    old_logprobs: torch.Tensor
    advantages: torch.Tensor
    mask: torch.Tensor
    ref_logprobs: torch.Tensor | None = None  # passed to losses that take it


def run_with_timeout(fn: Callable[[], Any], timeout: float) -> Any:
    """Run `fn` in a daemon thread; raise `CheckFailed` if it raises or takes longer than `timeout` s.

    A Python thread cannot be killed: one that hangs is left running in the background, detached.
    """
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn()
        except BaseException as e:  # the code under test may raise anything, SystemExit included
            result["error"] = e

    thread = threading.Thread(target=target, name="forge_nb-live-check", daemon=True)
    thread.start()
    thread.join(timeout)
    if thread.is_alive():
        raise CheckFailed(f"did not return within the {timeout:g} s timeout (hangs?)")
    if isinstance(result.get("error"), CheckFailed):
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


def context_for(fn: Callable) -> Callable[[dict], dict]:
    """Which of a sample's context keywords `fn` takes: all of them when it has ``**kwargs``, else
    only the ones it names (so ``def reward(prompt, completion, target)`` works too)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return lambda context: context
    if any(p.kind is p.VAR_KEYWORD for p in params):
        return lambda context: context
    named = {p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
    return lambda context: {k: v for k, v in context.items() if k in named}


def call_reward(fn: Callable, sample: RewardSample, context: Callable[[dict], dict]) -> float:
    """`fn` on one sample, its value checked (`CheckFailed` if it is not a finite real number)."""
    return check_reward_value(fn(sample.prompt, sample.completion, sample.target, **context(sample.context)))


def score_each(fn: Callable, samples: list[RewardSample], values: list, errors: dict[int, str]) -> None:
    """Score every sample with `fn`, writing `values[i]` (a float) or `errors[i]` (why not) as it
    goes, so a caller that gives up on a hung reward still sees what was done."""
    context = context_for(fn)
    for i, sample in enumerate(samples):
        try:
            values[i] = call_reward(fn, sample, context)
        except CheckFailed as e:
            errors[i] = str(e)
        except Exception as e:
            errors[i] = describe_exception(e)


def score_members(
    fns: dict[str, Callable], samples: list[RewardSample], components: dict[str, list], errors: dict[int, str]
) -> None:
    """Score every sample with every named member into `components[name][i]`; `errors[i]` names the
    first member that failed on sample i (just the cause when there is one member). Writes as it
    goes, like `score_each`."""
    for name, fn in fns.items():
        failed: dict[int, str] = {}
        score_each(fn, samples, components[name], failed)
        for i, why in failed.items():
            errors.setdefault(i, f"{name}: {why}" if len(fns) > 1 else why)


def validate_reward(fn: Callable, samples: list[RewardSample], timeout: float) -> list[float]:
    """Rewards of every probe sample under `fn` -> list of floats; `CheckFailed` names the first bad one."""
    context = context_for(fn)

    def score_all() -> list[float]:
        values = []
        for i, p in enumerate(samples):
            try:
                values.append(call_reward(fn, p, context))
            except CheckFailed as e:
                where = f"for probe sample {i} (prompt {_tail(p.prompt)!r}, completion {_short(p.completion)!r})"
                raise CheckFailed(f"{e} {where}") from None
            except Exception as e:
                raise CheckFailed(f"{describe_exception(e)} on probe sample {i} (prompt {_tail(p.prompt)!r})") from e
        return values

    return run_with_timeout(score_all, timeout)


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
