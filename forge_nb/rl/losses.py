"""Policy-gradient losses. Every loss has the signature of a user loss cell:

``loss(logprobs, old_logprobs, advantages, mask, **options) -> scalar tensor``

with logprobs, old_logprobs, mask [B, T] (T next-token positions, mask 1 on generated tokens) and
advantages [B] (one per sequence) or [B, T]. `old_logprobs` are the behaviour policy's: the generator's that
sampled the tokens, so the ratio also carries any trainer/generator mismatch.

Options the built-in losses share (each defaults to off, and TRL 1.16's `GRPOConfig` has each under the name in
brackets, computed the same way: `tests/rl/test_losses_vs_trl.py` runs TRL's own loss on the same tensors):

- ``ratio_level="sequence"`` [importance_sampling_level]: GSPO's ratio, ``exp`` of the mean log-ratio over each
  sequence's tokens [B, 1], one ratio (and one clip) per sequence instead of one per token;
- ``delta`` [delta] (clipped losses): INTELLECT-2's two-sided clip, the unclipped ratio capped at `delta` (> 1),
  so a negative advantage cannot be multiplied without bound; 0: off;
- ``off_policy_mask`` [off_policy_mask_threshold]: DeepSeek-V3.2's off-policy sequence masking, a sequence with a
  negative advantage whose mean ``old_logprobs - logprobs`` over its tokens is above this is left out of the loss
  (not of its normaliser); None: off;
- ``beta`` with ``ref_logprobs`` [beta]: `beta` x the k3 KL(policy || reference) added to every token's term, so it
  is aggregated as the loss aggregates its tokens (TRL's and verl's way); 0: off; ``kl_unbiased``
  [use_bias_correction_kl, True in TRL 1.16]: that KL times the importance ratio (DeepSeek-V3.2's unbiased KL
  gradient);
- ``top_entropy_quantile`` with ``entropies`` [top_entropy_quantile]: "Beyond the 80/20 rule" (Wang et al., 2025):
  only the tokens whose policy entropy is in the top `top_entropy_quantile` of the batch's tokens keep their policy
  term (the others still count in the normaliser; the KL term is kept on every token, as TRL does); 1.0: off.
  ``entropies`` [B, T] are the policy's per-token entropies (the trainer passes them to a loss that names them).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch


def masked_mean(values: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean of `values` where `mask` is 1; 0 (not NaN) where the mask is empty."""
    total = (values * mask).sum() if dim is None else (values * mask).sum(dim)
    count = mask.sum() if dim is None else mask.sum(dim)
    return total / count.clamp(min=1.0)


def _per_row(advantages: torch.Tensor) -> torch.Tensor:
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
    adv = _per_row(advantages)
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
    adv = _per_row(advantages)
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
class _Shared:
    """The options every built-in loss takes after its own (the module docstring's)."""

    ratio_level: str
    off_policy_mask: float | None
    ref_logprobs: torch.Tensor | None
    beta: float
    kl_unbiased: bool
    entropies: torch.Tensor | None = None
    top_entropy_quantile: float = 1.0


def _terms(
    per_token: torch.Tensor,
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    shared: _Shared,
) -> torch.Tensor:
    """A loss's per-token terms [B, T] or [B, 1] x the off-policy mask x the high-entropy mask, plus `beta` x the
    k3 KL to the reference per token [B, T] (in TRL's order), before the loss aggregates them its own way; with
    `kl_unbiased`, that KL times the importance ratio (with its gradient: DeepSeek-V3.2's unbiased KL gradient)."""
    per_token = per_token * off_policy_keep(logprobs, old_logprobs, advantages, mask, shared.off_policy_mask)
    if shared.top_entropy_quantile < 1.0:
        if shared.entropies is None:
            raise ValueError(
                f"top_entropy_quantile={shared.top_entropy_quantile} needs entropies (the policy's, per token: "
                "name `entropies` in the loss's parameters and pass it on)"
            )
        per_token = per_token * high_entropy_mask(shared.entropies, mask, shared.top_entropy_quantile)
    if not shared.beta:
        return per_token
    if shared.ref_logprobs is None:
        raise ValueError(f"beta={shared.beta} needs ref_logprobs (the reference model's: algorithm.kl_coef > 0)")
    penalty = kl_k3(logprobs, shared.ref_logprobs)
    if shared.kl_unbiased:
        penalty = penalty * torch.exp(log_ratio(logprobs, old_logprobs, mask, shared.ratio_level))
    return per_token + shared.beta * penalty


def grpo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_eps: float = 0.2,
    clip_high: float | None = None,
    token_level: bool = False,
    ratio_level: str = "token",
    delta: float = 0.0,
    off_policy_mask: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_unbiased: bool = False,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> torch.Tensor:
    """Clipped-ratio GRPO surrogate, negated for minimisation -> scalar.

    ``ratio = exp(logprobs - old_logprobs)`` [B, T];
    ``per_token = -min(ratio * A, clip(ratio, 1 - eps, 1 + high) * A)`` [B, T] (`clip_high` None: high = eps).
    Sequence-level (the GRPO paper): mean over each sequence's tokens, then over sequences.
    Token-level (`token_level=True`, DAPO): mean over all generated tokens of the batch.
    With ``ratio_level="sequence"``, sequence-level, this is GSPO. `delta`, `off_policy_mask`: the module's.
    """
    high = clip_eps if clip_high is None else clip_high
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, high, mask, ratio_level, delta)
    shared = _Shared(ratio_level, off_policy_mask, ref_logprobs, beta, kl_unbiased, entropies, top_entropy_quantile)
    per_token = _terms(per_token, logprobs, old_logprobs, advantages, mask, shared)
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
    clip_high: float | None = None,
    max_tokens: int | None = None,
    ratio_level: str = "token",
    delta: float = 0.0,
    off_policy_mask: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_unbiased: bool = False,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> torch.Tensor:
    """Dr.GRPO ("GRPO done right"): the clipped surrogate summed over tokens and divided by a
    constant B x `max_tokens` (default: T), so long and short answers are not re-weighted by their
    length. Pair it with advantages that are not divided by the group std -> scalar."""
    high = clip_eps if clip_high is None else clip_high
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, high, mask, ratio_level, delta)
    shared = _Shared(ratio_level, off_policy_mask, ref_logprobs, beta, kl_unbiased, entropies, top_entropy_quantile)
    per_token = _terms(per_token, logprobs, old_logprobs, advantages, mask, shared)
    return (per_token * mask).sum() / (mask.shape[0] * (max_tokens or mask.shape[1]))


def dapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    ratio_level: str = "token",
    delta: float = 0.0,
    off_policy_mask: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_unbiased: bool = False,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> torch.Tensor:
    """DAPO: clip-higher (ratio clipped to [1 - clip_low, 1 + clip_high]) and token-level mean over
    every generated token of the batch -> scalar. Dynamic sampling and the overlong penalty live in
    `forge_nb.rl.advantages` (they act on groups and rewards, not on the loss)."""
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high, mask, ratio_level, delta)
    shared = _Shared(ratio_level, off_policy_mask, ref_logprobs, beta, kl_unbiased, entropies, top_entropy_quantile)
    per_token = _terms(per_token, logprobs, old_logprobs, advantages, mask, shared)
    return masked_mean(per_token, mask)


def cispo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    rho_max: float = 2.0,
    ratio_level: str = "token",
    off_policy_mask: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_unbiased: bool = False,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> torch.Tensor:
    """CISPO (MiniMax-M1; ScaleRL's choice): the importance weight ``exp(logprobs - old_logprobs)`` is clipped,
    not the update: ``-min(ratio, rho_max).detach() * A * logprobs`` per token, token-level mean -> scalar. Every
    token keeps a gradient (a clipped ratio only caps its weight); TRL's ``loss_type="cispo"`` with
    ``epsilon_high=rho_max`` (ScaleRL recommends 5.0). The same loss as `aipo_loss`."""
    weight = torch.exp(log_ratio(logprobs, old_logprobs, mask, ratio_level)).clamp(max=rho_max).detach()
    per_token = -weight * _per_row(advantages) * logprobs
    shared = _Shared(ratio_level, off_policy_mask, ref_logprobs, beta, kl_unbiased, entropies, top_entropy_quantile)
    per_token = _terms(per_token, logprobs, old_logprobs, advantages, mask, shared)
    return masked_mean(per_token, mask)


def sapo_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    ratio_level: str = "token",
    off_policy_mask: float | None = None,
    ref_logprobs: torch.Tensor | None = None,
    beta: float = 0.0,
    kl_unbiased: bool = False,
    entropies: torch.Tensor | None = None,
    top_entropy_quantile: float = 1.0,
) -> torch.Tensor:
    """SAPO (Soft Adaptive Policy Optimization): a smooth gate instead of the hard clip,
    ``-sigmoid(tau * (ratio - 1)) * 4 / tau * A`` per token, with `tau_pos` where A > 0 and `tau_neg` elsewhere
    (its gradient is the policy gradient at ratio 1 and fades as the ratio leaves it); mean over each sequence's
    tokens, then over sequences -> scalar (TRL's ``loss_type="sapo"``)."""
    adv = _per_row(advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask, ratio_level))
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    per_token = -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv
    shared = _Shared(ratio_level, off_policy_mask, ref_logprobs, beta, kl_unbiased, entropies, top_entropy_quantile)
    per_token = _terms(per_token, logprobs, old_logprobs, advantages, mask, shared)
    return masked_mean(per_token, mask, dim=1).mean()


def kl_k3(logprobs: torch.Tensor, ref_logprobs: torch.Tensor) -> torch.Tensor:
    """Per-token k3 estimate of KL(policy || reference) [B, T]: ``exp(r) - r - 1`` with
    ``r = ref_logprobs - logprobs``; non-negative, unbiased, low variance (Schulman's k3)."""
    r = ref_logprobs - logprobs
    return torch.exp(r) - r - 1.0


def kl_penalty(logprobs: torch.Tensor, ref_logprobs: torch.Tensor, mask: torch.Tensor, beta: float) -> torch.Tensor:
    """`beta` x the k3 KL(policy || reference) [B, T], averaged per sequence then over sequences -> scalar
    (0 for empty rows), for a loss cell. The built-in losses take ``ref_logprobs=, beta=`` instead, which
    aggregates it with their own tokens (the same as this for grpo's per-sequence mean)."""
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
    behaviour policy's, i.e. those of the (possibly stale) generator that sampled the tokens. The same
    loss as `cispo_loss`."""
    return cispo_loss(logprobs, old_logprobs, advantages, mask, rho_max)


@dataclass(frozen=True)
class BuiltinLoss:
    """A loss that `algorithm.loss` can name: the function, and where each of its keyword options
    comes from -- the `AlgorithmConfig` field (or property) of that name, or ``"max_tokens"`` for engine.max_tokens.
    `modifiers` likewise, for the options the losses share (the module docstring's), which loss v0's source
    names only when they are not the function's default. A mapping of names, not a function of the config,
    so that config can import this registry to validate `algorithm.loss` without this module importing config."""

    fn: Callable[..., torch.Tensor]
    options: dict[str, str]  # keyword of `fn` -> AlgorithmConfig field, or "max_tokens"
    modifiers: dict[str, str] = field(default_factory=dict)


_ENTROPY = {"top_entropy_quantile": "top_entropy_quantile"}
_CLIPPED = {"ratio_level": "ratio_level", "delta": "clip_delta", "off_policy_mask": "off_policy_mask", **_ENTROPY}
_WEIGHTED = {"ratio_level": "ratio_level", "off_policy_mask": "off_policy_mask", **_ENTROPY}
_ASYMMETRIC = {"clip_high": "clip_high", **_CLIPPED}  # grpo's and dr_grpo's upper clip: written when it is set

#: The built-in losses by `algorithm.loss` name; `forge_nb.live.builtin.builtin_loss` makes loss v0 from one.
#: Dr.GRPO divides by B x engine.max_tokens (a constant), as the paper and TRL do. "aipo" is CISPO's loss (its
#: older name here).
LOSSES: dict[str, BuiltinLoss] = {
    "grpo": BuiltinLoss(grpo_loss, {"clip_eps": "clip_eps", "token_level": "token_level"}, _ASYMMETRIC),
    "dr_grpo": BuiltinLoss(dr_grpo_loss, {"clip_eps": "clip_eps", "max_tokens": "max_tokens"}, _ASYMMETRIC),
    "dapo": BuiltinLoss(dapo_loss, {"clip_low": "clip_eps", "clip_high": "upper_clip"}, _CLIPPED),
    "cispo": BuiltinLoss(cispo_loss, {"rho_max": "rho_max"}, _WEIGHTED),
    "aipo": BuiltinLoss(cispo_loss, {"rho_max": "rho_max"}, _WEIGHTED),
    "sapo": BuiltinLoss(sapo_loss, {"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg"}, _WEIGHTED),
}
