"""Policy-gradient losses. Every loss has the signature of a user loss cell:

``loss(logprobs, old_logprobs, advantages, mask, **options) -> scalar tensor``

with logprobs, old_logprobs, mask [B, T] (T next-token positions, mask 1 on generated tokens) and
advantages [B] (one per sequence) or [B, T].
"""

from __future__ import annotations

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


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
    adv = advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]
    ratio = torch.exp(logprobs - old_logprobs)
    clipped = ratio.clamp(1.0 - clip_eps, 1.0 + clip_eps)
    per_token = -torch.minimum(ratio * adv, clipped * adv)
    if token_level:
        return masked_mean(per_token, mask)
    per_sequence = masked_mean(per_token, mask, dim=1)  # [B]
    return per_sequence.mean()
