"""Policy-gradient losses. Every loss has the signature of a user loss cell:

``loss(logprobs, old_logprobs, advantages, mask, **options) -> scalar tensor``

with logprobs, old_logprobs, mask [B, T] (T next-token positions, mask 1 on generated tokens) and
advantages [B] (one per sequence) or [B, T].
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def clipped_surrogate(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, advantages: torch.Tensor, low: float, high: float
) -> torch.Tensor:
    """Per-token PPO/GRPO objective, negated -> [B, T]:
    ``ratio = exp(logprobs - old_logprobs)``; ``-min(ratio * A, clip(ratio, 1 - low, 1 + high) * A)``."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    ratio = torch.exp(logprobs - old_logprobs)
    return -torch.minimum(ratio * adv, ratio.clamp(1.0 - low, 1.0 + high) * adv)


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    token_level: bool = False,
) -> torch.Tensor:
    """Clipped-ratio GRPO surrogate, negated for minimisation -> scalar.

    ``ratio = exp(logprobs - old_logprobs)`` [B, T];
    ``per_token = -min(ratio * A, clip(ratio, 1 - eps, 1 + eps) * A)`` [B, T].
    Sequence-level (the GRPO paper): mean over each sequence's tokens, then over sequences.
    Token-level (`token_level=True`, DAPO): mean over all generated tokens of the batch.
    """
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, clip_eps)
    if token_level:
        return masked_mean(per_token, mask)
    per_sequence = masked_mean(per_token, mask, dim=1)  # [B]
    return per_sequence.mean()


def dr_grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    max_tokens: int | None = None,
) -> torch.Tensor:
    """Dr.GRPO ("GRPO done right"): the clipped surrogate summed over tokens and divided by a
    constant B x `max_tokens` (default: T), so long and short answers are not re-weighted by their
    length. Pair it with advantages that are not divided by the group std -> scalar."""
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, clip_eps)
    return (per_token * mask).sum() / (mask.shape[0] * (max_tokens or mask.shape[1]))


def dapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
) -> torch.Tensor:
    """DAPO: clip-higher (ratio clipped to [1 - clip_low, 1 + clip_high]) and token-level mean over
    every generated token of the batch -> scalar. Dynamic sampling and the overlong penalty live in
    `forge_nb.rl.advantages` (they act on groups and rewards, not on the loss)."""
    return masked_mean(clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high), mask)


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) [B, T]: ``exp(r) - r - 1`` with
    ``r = ref_logprobs - logprobs``; non-negative, unbiased, low variance (Schulman's k3)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """`beta` x the k3 KL(policy || reference) [B, T], averaged per sequence then over sequences -> scalar
    (0 for empty rows). Add it to any loss of the family."""
    return beta * masked_mean(kl_k3(logprobs, ref_logprobs), mask, dim=1).mean()


def aipo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rho_max: float = 2.0,
) -> torch.Tensor:
    """AIPO-style off-policy correction for asynchronous training: the policy gradient weighted by
    the importance ratio current / behaviour policy, truncated at `rho_max` and detached
    (``-min(exp(lp - old_lp), rho) * A * lp``), token-level mean -> scalar. `old_logprobs` are the
    behaviour policy's, i.e. those of the (possibly stale) generator that sampled the tokens."""
    adv = advantages[:, None] if advantages.dim() == 1 else advantages
    weight = torch.exp(logprobs - old_logprobs).clamp(max=rho_max).detach()
    return masked_mean(-weight * adv * logprobs, mask)


@dataclass(frozen=True)
class BuiltinLoss:
    """A loss that `algorithm.loss` can name: the function, and where each of its keyword options
    comes from -- the `AlgorithmConfig` field of that name, or ``"max_tokens"`` for engine.max_tokens.
    A mapping of names, not a function of the config, so that config can import this registry to
    validate `algorithm.loss` without this module importing config."""

    fn: Callable[..., torch.Tensor]
    options: dict[str, str]  # keyword of `fn` -> AlgorithmConfig field, or "max_tokens"


#: The built-in losses by `algorithm.loss` name; `forge_nb.live.builtin.builtin_loss` makes loss v0 from one.
#: Dr.GRPO divides by B x engine.max_tokens (a constant), as the paper and TRL do.
LOSSES: dict[str, BuiltinLoss] = {
    "grpo": BuiltinLoss(grpo_loss, {"clip_eps": "clip_eps", "token_level": "token_level"}),
    "dr_grpo": BuiltinLoss(dr_grpo_loss, {"clip_eps": "clip_eps", "max_tokens": "max_tokens"}),
    "dapo": BuiltinLoss(dapo_loss, {"clip_low": "clip_eps", "clip_high": "clip_high"}),
    "aipo": BuiltinLoss(aipo_loss, {"rho_max": "rho_max"}),
}
