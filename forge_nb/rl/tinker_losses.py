"""Tinker's built-in losses (the `loss_fn` names of the `tinker` SDK's `forward_backward`), as Tinker defines
them (tinker-docs.thinkingmachines.ai/tinker/losses: each page's formula and its "implemented as" snippet).

Notation, per datum and per position t of its N: ``logprobs`` is the policy's logprob of ``target_tokens[t]``
(what the trainer computes, and what `forward_backward` returns); ``sampling_logprobs`` the sampler's (the
datum's ``logprobs`` input); ``advantages`` and ``weights`` the datum's inputs of those names;
``ratio = exp(logprobs - sampling_logprobs)``. Every tensor is [B, T] (B datums right-padded to T positions;
every input is 0 on padding). Each function returns the per-token loss [B, T]; Tinker's loss is its *sum* over
every position of every datum (no mean: ``loss = -objective.sum()`` on every page), `total` below.

=====================  =========================================================  ==================================
loss_fn                per-token loss                                             loss_fn_config (default)
=====================  =========================================================  ==================================
cross_entropy          ``-weights * logprobs``                                    --
importance_sampling    ``-ratio * advantages``                                    --
ppo                    ``-min(ratio * A, clamp(ratio, low, high) * A)``           clip_low_threshold (0.8),
                                                                                  clip_high_threshold (1.2)
cispo                  ``-sg[clamp(ratio, low, high)] * logprobs * A``            the same two
dro                    ``-(logprobs * A - beta / 2 * (logprobs - sampling)^2)``   beta (required: no default)
=====================  =========================================================  ==================================

The thresholds bound the ratio itself (Tinker's snippet clamps ``prob_ratio`` to them), so 0.8 and 1.2 are
PPO's epsilon of 0.2. They may also come per token, as ``loss_fn_inputs`` of the same names.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

Tensor = torch.Tensor


def cross_entropy(logprobs: Tensor, weights: Tensor) -> Tensor:
    """Supervised learning: the weighted negative log-likelihood of the targets [B, T]. Weights may be any
    real number (the SDK's client-side custom loss sends ``-dC/dlogprobs`` as weights)."""
    return -weights * logprobs


def importance_sampling(logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor) -> Tensor:
    """REINFORCE with an importance weight for the sampler/learner mismatch: ``-ratio * A`` [B, T]."""
    ratio = torch.exp(logprobs - sampling_logprobs)
    return -ratio * advantages


def ppo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    clip_low_threshold: float | Tensor = 0.8,
    clip_high_threshold: float | Tensor = 1.2,
) -> Tensor:
    """PPO's clipped surrogate, token by token: ``-min(ratio * A, clamp(ratio, low, high) * A)`` [B, T]."""
    ratio = torch.exp(logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, _like(clip_low_threshold, ratio), _like(clip_high_threshold, ratio))
    return -torch.min(ratio * advantages, clipped * advantages)


def cispo(
    logprobs: Tensor,
    sampling_logprobs: Tensor,
    advantages: Tensor,
    clip_low_threshold: float | Tensor = 0.8,
    clip_high_threshold: float | Tensor = 1.2,
) -> Tensor:
    """CISPO: the clipped ratio, detached, weighs the policy gradient: ``-sg[clamp(ratio, low, high)] *
    logprobs * A`` [B, T] (every token keeps a gradient; the clip only caps its weight)."""
    ratio = torch.exp(logprobs - sampling_logprobs)
    clipped = torch.clamp(ratio, _like(clip_low_threshold, ratio), _like(clip_high_threshold, ratio))
    return -clipped.detach() * logprobs * advantages


def dro(logprobs: Tensor, sampling_logprobs: Tensor, advantages: Tensor, beta: float | Tensor) -> Tensor:
    """DRO: the policy gradient with a quadratic penalty on the log-ratio: ``-(logprobs * A - beta / 2 *
    (logprobs - sampling_logprobs)^2)`` [B, T] (its soft advantages are the client's to compute)."""
    return -(logprobs * advantages - 0.5 * beta * (logprobs - sampling_logprobs) ** 2)


def _like(bound: float | Tensor, ratio: Tensor) -> Tensor:
    """A scalar or per-token bound as a tensor `torch.clamp` takes with a tensor of `ratio`'s kind."""
    return bound.to(ratio) if isinstance(bound, Tensor) else torch.full_like(ratio, float(bound))


@dataclass(frozen=True)
class TinkerLoss:
    """A loss `forward_backward` can name: the function; the `loss_fn_inputs` it takes besides
    ``target_tokens``, in the function's order (Tinker's names: ``logprobs`` is the function's
    ``sampling_logprobs``); `optional` inputs and their value when absent; its `loss_fn_config` keys with their
    defaults (None: required); and the config keys that may also come per token, as inputs."""

    fn: Callable[..., Tensor]
    inputs: tuple[str, ...]
    optional: dict[str, float] = field(default_factory=dict)
    config: dict[str, float | None] = field(default_factory=dict)
    per_token_config: tuple[str, ...] = ()

    @property
    def accepted_inputs(self) -> tuple[str, ...]:
        """Every `loss_fn_inputs` key it reads (``target_tokens`` first)."""
        return ("target_tokens", *self.inputs, *self.optional, *self.per_token_config)


_THRESHOLDS = {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}
_RL = ("logprobs", "advantages")

#: The losses `forward_backward(loss_fn=...)` serves, by Tinker's names. A missing ``weights`` of
#: cross_entropy counts every position (1.0), as the open Tinker servers take it; Tinker's docs list it as an
#: input and do not say.
LOSSES: dict[str, TinkerLoss] = {
    "cross_entropy": TinkerLoss(cross_entropy, (), optional={"weights": 1.0}),
    "importance_sampling": TinkerLoss(importance_sampling, _RL),
    "ppo": TinkerLoss(ppo, _RL, config=_THRESHOLDS, per_token_config=tuple(_THRESHOLDS)),
    "cispo": TinkerLoss(cispo, _RL, config=_THRESHOLDS, per_token_config=tuple(_THRESHOLDS)),
    "dro": TinkerLoss(dro, _RL, config={"beta": None}),
}


def per_token(name: str, logprobs: Tensor, inputs: dict[str, Tensor], config: dict[str, float]) -> Tensor:
    """Loss `name`'s per-token loss [B, T] of `logprobs` [B, T], the datums' float `inputs` (each [B, T], by
    Tinker's name) and `config` (validated: `check_config`). Missing optional inputs take their default; a
    config key given as an input too is taken per token."""
    loss = LOSSES[name]
    given = {key: inputs[key] for key in loss.inputs}
    given.update({k: inputs[k] if k in inputs else torch.full_like(logprobs, v) for k, v in loss.optional.items()})
    options: dict[str, float | Tensor] = {k: v for k, v in loss.config.items() if v is not None}
    options.update(config)
    options.update({k: inputs[k] for k in loss.per_token_config if k in inputs})
    return loss.fn(logprobs, **{_PARAMETER.get(k, k): v for k, v in given.items()}, **options)


#: Tinker's input names that are not the functions' own (its "logprobs" input is the sampler's).
_PARAMETER = {"logprobs": "sampling_logprobs"}


def total(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """Tinker's reduction: the sum over every datum's positions (`mask` [B, T] 1 on them) -> a scalar."""
    return (per_token_loss * mask).sum()


def per_datum(per_token_loss: Tensor, mask: Tensor) -> Tensor:
    """Each datum's own sum [B] (the requests a batch merged each get theirs back)."""
    return (per_token_loss * mask).sum(dim=1)


def check_config(name: str, config: dict[str, float | str]) -> dict[str, float]:
    """`config` for loss `name` -> the floats it takes; `ValueError` naming the key for one it does not take,
    one it requires and lacks, or a value that is not a number."""
    loss = LOSSES[name]
    unknown = sorted(set(config) - set(loss.config))
    if unknown:
        takes = ", ".join(loss.config) or "none"
        raise ValueError(f"loss_fn_config.{unknown[0]}: not a setting of {name} (its settings: {takes})")
    missing = [k for k, v in loss.config.items() if v is None and k not in config]
    if missing:
        raise ValueError(f"loss_fn_config.{missing[0]}: {name} requires it (Tinker's docs give no default)")
    out = {}
    for key, value in config.items():
        if isinstance(value, bool) or not isinstance(value, int | float):
            raise ValueError(f"loss_fn_config.{key}: a number, got {value!r}")
        out[key] = float(value)
    return out
