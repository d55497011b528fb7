"""Checks live code must pass before it gets a version: run it on a probe batch, with a timeout.

A reward must return a finite real number for every probe sample (a batched reward: a list of them,
one per sample); a loss must return a finite scalar tensor that requires grad, whose backward
succeeds with finite gradients. The same value checks guard the actors at run time
(`rewards.scoring.check_reward_value`, `check_loss_value`). What a failed check raises is in `forge_nb.checks`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from forge_nb.checks import CheckFailed, CheckTimedOut, describe_exception, short_repr
from forge_nb.live.deadline import start_thread, wait_for
from forge_nb.rewards.batch import RewardSample, columns_of
from forge_nb.rewards.forms import by_name, is_batched, keywords_for
from forge_nb.rewards.judge_client import JudgeUnavailable
from forge_nb.rewards.scoring import batch_values, call_reward
from forge_nb.rl.update import takes_entropies, takes_ref


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
    than `timeout` s of its own (time waiting on a judge actor or for a CPU does not count: `live.deadline`).
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

    thread = start_thread(target, "forge_nb-live-check")
    if not wait_for(done, timeout, thread):
        raise CheckTimedOut(f"did not return within the {timeout:g} s timeout (hangs?)")
    if isinstance(result.get("error"), CheckFailed | JudgeUnavailable):
        raise result["error"]
    if "error" in result:
        raise CheckFailed(describe_exception(result["error"]))
    return result.get("value")


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
    return f"for probe sample {i} (prompt {_tail(sample.prompt)!r}, completion {short_repr(sample.completion)!r})"


def check_loss_value(loss: Any) -> torch.Tensor:
    """`loss` if it is a finite scalar tensor that requires grad, else `CheckFailed`."""
    if not isinstance(loss, torch.Tensor):
        raise CheckFailed(f"returned {type(loss).__name__} {short_repr(loss)}; expected a scalar torch.Tensor")
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
            ref = probe.ref_logprobs
            extra = {"ref_logprobs": ref.clone()} if ref is not None and takes_ref(fn) else {}
            if takes_entropies(fn):  # no model here: each token's surprisal stands in (>= 0, varies as one does)
                extra["entropies"] = (-probe.old_logprobs).clamp(min=0) * probe.mask
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


def _tail(text: str, most: int = 60) -> str:
    """The end of a prompt (where a chat-templated prompt has the question)."""
    return text if len(text) <= most else "..." + text[-(most - 3) :]
