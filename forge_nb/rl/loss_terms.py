"""The pieces the built-in losses (`rl.losses`) are made of: the masked mean, the importance ratio and its clip,
DeepSeek-V3.2's off-policy mask, the high-entropy token mask, the k3 KL to the reference, and `modified`, which
applies TRL's modifiers (`Modifiers`, the options every built-in loss shares) to its per-token terms. Shapes:
[B, T] per token (T next-token positions), advantages [B] or [B, T]."""

from __future__ import annotations

from dataclasses import dataclass

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def per_row(advantages: torch.Tensor) -> torch.Tensor:
    """Advantages as per-token terms take them: [B] -> [B, 1]; [B, T] as they are."""
    return advantages[:, None] if advantages.dim() == 1 else advantages  # [B, 1] or [B, T]


def log_ratio(
    logprobs: torch.Tensor, old_logprobs: torch.Tensor, mask: torch.Tensor | None = None, level: str = "token"
) -> torch.Tensor:
    """``logprobs - old_logprobs``: [B, T] per token (``level="token"``), or [B, 1] its mean over each sequence's
    masked tokens (``"sequence"``, GSPO; 0 for an empty row)."""
    diff = logprobs - old_logprobs
    if level == "token":
        return diff
    if level != "sequence":
        raise ValueError(f"ratio_level must be 'token' or 'sequence', got {level!r}")
    if mask is None:
        raise ValueError("ratio_level='sequence' needs the mask (the mean is over each sequence's own tokens)")
    return masked_mean(diff, mask, dim=1)[:, None]


def clipped_surrogate(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    low: float,
    high: float,
    mask: torch.Tensor | None = None,
    ratio_level: str = "token",
    delta: float = 0.0,
) -> torch.Tensor:
    """Per-token PPO/GRPO objective, negated -> [B, T] ([B, 1] at ``ratio_level="sequence"``, which needs `mask`):
    ``ratio = exp(log_ratio)``; ``-min(min(ratio, delta) * A, clip(ratio, 1 - low, 1 + high) * A)`` (`delta` 0: no
    cap on the first term)."""
    adv = per_row(advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask, ratio_level))
    clipped = ratio.clamp(1.0 - low, 1.0 + high) * adv
    if delta:
        ratio = ratio.clamp(max=delta)
    return -torch.minimum(ratio * adv, clipped)


def off_policy_keep(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    threshold: float | None,
) -> torch.Tensor | float:
    """DeepSeek-V3.2's off-policy sequence mask [B, 1]: 0 for a sequence whose advantage is negative and whose mean
    ``old_logprobs - logprobs`` (a k1 KL(behaviour || current), no gradient) over its tokens is above `threshold`;
    1 elsewhere. `threshold` None: off (1.0)."""
    if threshold is None:
        return 1.0
    kl = masked_mean(old_logprobs - logprobs.detach(), mask, dim=1)[:, None]
    adv = per_row(advantages)
    return ((adv >= 0) | (kl <= threshold)).to(mask.dtype)


def quantile(values: torch.Tensor, q: float) -> torch.Tensor:
    """The `q` (in [0, 1]) quantile of a 1-D tensor, linearly interpolated (``torch.quantile``'s default), at any
    size (``torch.quantile`` refuses more than 2**24 values: a batch's tokens can be more)."""
    if not 0.0 <= q <= 1.0:
        raise ValueError(f"a quantile is in [0, 1], got {q}")
    ordered = values.sort().values
    position = q * (len(ordered) - 1)
    if abs(position - round(position)) < 1e-9:  # 0.05 * 20 is 1.0000000000000002: on the value, not past it
        position = float(round(position))
    below = int(position)
    above = min(below + 1, len(ordered) - 1)
    return torch.lerp(ordered[below], ordered[above], position - below)


def high_entropy_mask(entropies: torch.Tensor, mask: torch.Tensor, top: float) -> torch.Tensor:
    """[B, T], 1 on the masked tokens whose entropy is at least the ``1 - top`` quantile of the masked tokens'
    entropies (the top `top` share of them; 0: the largest only), 0 elsewhere; all 0 when the mask is empty (TRL's
    `get_high_entropy_mask`)."""
    chosen = mask.bool()
    values = entropies.detach().float()
    if not bool(chosen.any()):
        return torch.zeros_like(mask)
    threshold = quantile(values[chosen], 1.0 - top)
    return ((values * mask.float() >= threshold) & chosen).to(mask.dtype)


@dataclass(frozen=True)
class Modifiers:
    """TRL's modifiers, which every built-in loss takes after its own options (`rl.losses`' docstring says what
    each does; TRL's `GRPOConfig` name in brackets). Each is off by default."""

    ratio_level: str = "token"  # "sequence": GSPO's one ratio per sequence [importance_sampling_level]
    off_policy_mask: float | None = None  # DeepSeek-V3.2's off-policy sequence mask [off_policy_mask_threshold]
    beta: float = 0.0  # x k3 KL(policy || reference) per token, needs ref_logprobs [beta]
    kl_unbiased: bool = False  # that KL x the importance ratio [use_bias_correction_kl]
    top_entropy_quantile: float = 1.0  # policy term on the top share of tokens by entropy, needs entropies


PLAIN = Modifiers()


def modified(
    per_token: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    modifiers: Modifiers = PLAIN,
    ref_logprobs: torch.Tensor | None = None,
    entropies: torch.Tensor | None = None,
) -> torch.Tensor:
    """A loss's per-token terms [B, T] or [B, 1] x the off-policy mask [B, 1] x the high-entropy mask [B, T], plus
    `beta` x the k3 KL to the reference per token [B, T] (in TRL's order), before the loss aggregates them its own
    way; with `kl_unbiased`, that KL times the importance ratio (with its gradient: DeepSeek-V3.2's unbiased KL
    gradient)."""
    m = modifiers
    per_token = per_token * off_policy_keep(logprobs, old_logprobs, advantages, mask, m.off_policy_mask)
    if m.top_entropy_quantile < 1.0:
        if entropies is None:
            raise ValueError(
                f"top_entropy_quantile={m.top_entropy_quantile} needs entropies (the policy's, per token: "
                "name `entropies` in the loss's parameters and pass it on)"
            )
        per_token = per_token * high_entropy_mask(entropies, mask, m.top_entropy_quantile)
    if not m.beta:
        return per_token
    if ref_logprobs is None:
        raise ValueError(f"beta={m.beta} needs ref_logprobs (the reference model's: algorithm.kl_coef > 0)")
    penalty = kl_k3(logprobs, ref_logprobs)  # [B, T]
    if m.kl_unbiased:
        penalty = penalty * torch.exp(log_ratio(logprobs, old_logprobs, mask, m.ratio_level))
    return per_token + m.beta * penalty


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) [B, T]: ``exp(r) - r - 1`` with
    ``r = ref_logprobs - logprobs``; non-negative, unbiased, low variance (Schulman's k3)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """`beta` x the k3 KL(policy || reference) [B, T], averaged per sequence then over sequences -> scalar
    (0 for empty rows), for a loss cell. The built-in losses take ``ref_logprobs=`` and ``Modifiers(beta=...)``, which
    aggregates it with their own tokens (the same as this for grpo's per-sequence mean)."""
    return beta * masked_mean(kl_k3(logprobs, ref_logprobs), mask, dim=1).mean()
