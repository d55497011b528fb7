"""Policy-gradient losses. Every loss has the signature of a user loss cell:

``loss(logprobs, old_logprobs, advantages, mask, <its options>, *, ref_logprobs=None, entropies=None,
modifiers=Modifiers()) -> scalar tensor``

with logprobs, old_logprobs, mask [B, T] (T next-token positions, mask 1 on generated tokens) and
advantages [B] (one per sequence) or [B, T]. `old_logprobs` are the behaviour policy's: the generator's that
sampled the tokens, so the ratio also carries any trainer/generator mismatch.

TRL's modifiers, shared by every built-in loss, come as one `Modifiers` object; each defaults to off, and TRL
1.16's `GRPOConfig` has each under the name in brackets, computed the same way
(`tests/rl/test_losses_vs_trl.py` runs TRL's own loss on the same tensors):

- ``ratio_level="sequence"`` [importance_sampling_level]: GSPO's ratio, ``exp`` of the mean log-ratio over each
  sequence's tokens [B, 1], one ratio (and one clip) per sequence instead of one per token;
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

The clipped losses (grpo, dr_grpo, dapo, luspo) also take ``delta`` [delta]: INTELLECT-2's two-sided clip, the
unclipped ratio capped at `delta` (> 1), so a negative advantage cannot be multiplied without bound; 0: off.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from forge_nb.rl.loss_terms import (  # noqa: F401 -- re-exported: loss cells import these from here
    PLAIN,
    Modifiers,
    clipped_surrogate,
    high_entropy_mask,
    kl_k3,
    kl_penalty,
    log_ratio,
    masked_mean,
    modified,
    off_policy_keep,
    per_row,
    quantile,
)

Tensor = torch.Tensor


def grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_high: float | None = None,
    token_level: bool = False,
    delta: float = 0.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """Clipped-ratio GRPO surrogate, negated for minimisation -> scalar.

    ``ratio = exp(logprobs - old_logprobs)`` [B, T];
    ``per_token = -min(ratio * A, clip(ratio, 1 - eps, 1 + high) * A)`` [B, T] (`clip_high` None: high = eps).
    Sequence-level (the GRPO paper): mean over each sequence's tokens [B], then over sequences.
    Token-level (`token_level=True`, DAPO): mean over all generated tokens of the batch.
    With ``Modifiers(ratio_level="sequence")``, sequence-level, this is GSPO.
    """
    m = modifiers
    high = clip_eps if clip_high is None else clip_high
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, high, mask, m.ratio_level, delta)
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    if token_level:
        return masked_mean(per_token, mask)
    return masked_mean(per_token, mask, dim=1).mean()  # [B] -> scalar


def dr_grpo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_high: float | None = None,
    max_tokens: int | None = None,
    delta: float = 0.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """Dr.GRPO ("GRPO done right"): the clipped surrogate [B, T] summed over tokens and divided by a constant
    B x `max_tokens` (default: T), so long and short answers are not re-weighted by their length. Pair it with
    advantages that are not divided by the group std -> scalar."""
    m = modifiers
    high = clip_eps if clip_high is None else clip_high
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, high, mask, m.ratio_level, delta)
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    return (per_token * mask).sum() / (mask.shape[0] * (max_tokens or mask.shape[1]))


def dapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_low: float = 0.2,
    clip_high: float = 0.28,
    delta: float = 0.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """DAPO: clip-higher (ratio clipped to [1 - clip_low, 1 + clip_high]) and the mean over every generated token
    of the batch [B, T] -> scalar. Dynamic sampling and the overlong penalty live in `forge_nb.rl.advantages`
    (they act on groups and rewards, not on the loss)."""
    m = modifiers
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_low, clip_high, mask, m.ratio_level, delta)
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    return masked_mean(per_token, mask)


def cispo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rho_max: float = 2.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """CISPO (MiniMax-M1; ScaleRL's choice): the importance weight ``exp(logprobs - old_logprobs)`` is clipped,
    not the update: ``-min(ratio, rho_max).detach() * A * logprobs`` per token [B, T], token-level mean -> scalar.
    Every token keeps a gradient (a clipped ratio only caps its weight); TRL's ``loss_type="cispo"`` with
    ``epsilon_high=rho_max`` (ScaleRL recommends 5.0). The same loss as `aipo_loss`."""
    m = modifiers
    weight = torch.exp(log_ratio(logprobs, old_logprobs, mask, m.ratio_level)).clamp(max=rho_max).detach()
    per_token = -weight * per_row(advantages) * logprobs
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    return masked_mean(per_token, mask)


def sapo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    tau_pos: float = 1.0,
    tau_neg: float = 1.05,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """SAPO (Soft Adaptive Policy Optimization): a smooth gate instead of the hard clip,
    ``-sigmoid(tau * (ratio - 1)) * 4 / tau * A`` per token [B, T], with `tau_pos` where A > 0 and `tau_neg`
    elsewhere (its gradient is the policy gradient at ratio 1 and fades as the ratio leaves it); mean over each
    sequence's tokens, then over sequences -> scalar (TRL's ``loss_type="sapo"``)."""
    m = modifiers
    adv = per_row(advantages)
    ratio = torch.exp(log_ratio(logprobs, old_logprobs, mask, m.ratio_level))
    tau = torch.where(adv > 0, tau_pos, tau_neg)
    per_token = -torch.sigmoid(tau * (ratio - 1.0)) * 4.0 / tau * adv
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    return masked_mean(per_token, mask, dim=1).mean()


def luspo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    clip_eps: float = 0.2,
    clip_high: float | None = None,
    delta: float = 0.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """LUSPO (Length-Unbiased Sequence Policy Optimization, arXiv 2602.05261): GRPO's clipped surrogate [B, T],
    summed over each sequence's tokens (so a sequence counts by its length, not divided by it), then the mean over
    sequences -> scalar; the paper's setting is GSPO's ratio (``Modifiers(ratio_level="sequence")``). TRL's
    ``loss_type="luspo"``."""
    m = modifiers
    high = clip_eps if clip_high is None else clip_high
    per_token = clipped_surrogate(logprobs, old_logprobs, advantages, clip_eps, high, mask, m.ratio_level, delta)
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, m, ref_logprobs, entropies)
    return (per_token * mask).sum(dim=1).mean()


@torch.no_grad()
def gamma_weights(
    log_ratio_per_token: Tensor,
    advantages: Tensor,
    mask: Tensor,
    k: tuple[float, float] = (2.0, 3.0),
    lam: tuple[float, float] = (3.0, 2.0),
) -> Tensor:
    """VESPO's weight of each sequence [B, 1], no gradient: ``phi(w) = exp(lam) * w**k * exp(-lam * w)`` (1 at
    w = 1), w the sequence's importance ratio (``exp`` of its summed log-ratio, each token's clamped to [-20, 20],
    the sum to [log 1e-8, 20]); (k, lam) are ``k[0], lam[0]`` where A >= 0, ``k[1], lam[1]`` elsewhere."""
    summed = torch.sum(log_ratio_per_token.clamp(-20.0, 20.0) * mask, dim=-1, keepdim=True)
    log_w = summed.clamp(math.log(1e-8), 20.0)
    positive = per_row(advantages) >= 0
    k_seq = torch.where(positive, k[0], k[1])
    lam_seq = torch.where(positive, lam[0], lam[1]).clamp(min=1e-4)
    return torch.exp(lam_seq + k_seq * log_w - lam_seq * torch.exp(log_w)).nan_to_num(nan=0.0, posinf=0.0, neginf=0.0)


def vespo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    k_pos: float = 2.0,
    lambda_pos: float = 3.0,
    k_neg: float = 3.0,
    lambda_neg: float = 2.0,
    *,
    ref_logprobs: Tensor | None = None,
    entropies: Tensor | None = None,
    modifiers: Modifiers = PLAIN,
) -> Tensor:
    """VESPO (Variational Sequence-Level Soft Policy Optimization, arXiv 2602.10693): no clip; each sequence's
    policy gradient is scaled by a smooth, asymmetric Gamma-shaped weight of its importance ratio
    (`gamma_weights`, [B, 1]), ``-phi(w) * A * logprobs`` per token [B, T], the mean over the batch's tokens ->
    scalar. TRL's ``loss_type="vespo"`` (the modifiers' `ratio_level` is for the unbiased KL term only: VESPO's
    ratio is its own)."""
    phi = gamma_weights(logprobs - old_logprobs, advantages, mask, (k_pos, k_neg), (lambda_pos, lambda_neg))
    per_token = -phi * per_row(advantages) * logprobs
    per_token = modified(per_token, logprobs, old_logprobs, advantages, mask, modifiers, ref_logprobs, entropies)
    return masked_mean(per_token, mask)


def aipo_loss(
    logprobs: Tensor,
    old_logprobs: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rho_max: float = 2.0,
) -> Tensor:
    """AIPO-style off-policy correction for asynchronous training: the policy gradient weighted by
    the importance ratio current / behaviour policy, truncated at `rho_max` and detached
    (``-min(exp(lp - old_lp), rho) * A * lp``), token-level mean -> scalar. `old_logprobs` are the
    behaviour policy's, i.e. those of the (possibly stale) generator that sampled the tokens. The same
    loss as `cispo_loss`."""
    return cispo_loss(logprobs, old_logprobs, advantages, mask, rho_max)


@dataclass(frozen=True)
class BuiltinLoss:
    """A loss that `algorithm.loss` can name: the function, and where each of its options comes from -- the
    `AlgorithmConfig` field (or property) of that name, or ``"max_tokens"`` for engine.max_tokens. `options` are
    always written into loss v0's source; `optional` (its own) and `modifiers` (`Modifiers`' fields) only when
    they differ from the default. A mapping of names, not a function of the config, so that config can import this
    registry to validate `algorithm.loss` without this module importing config."""

    fn: Callable[..., Tensor]
    options: dict[str, str]  # keyword of `fn` -> AlgorithmConfig field, or "max_tokens"
    optional: dict[str, str] = field(default_factory=dict)
    modifiers: dict[str, str] = field(default_factory=dict)  # field of Modifiers -> AlgorithmConfig field


_MODIFIERS = {
    "ratio_level": "ratio_level",
    "off_policy_mask": "off_policy_mask",
    "top_entropy_quantile": "top_entropy_quantile",
}  # beta and kl_unbiased come with the reference (`live.builtin.builtin_loss`)
_CLIPPED = {"delta": "clip_delta"}
_ASYMMETRIC = {"clip_high": "clip_high", **_CLIPPED}  # grpo's, dr_grpo's, luspo's upper clip: when set
_VESPO = ("k_pos", "lambda_pos", "k_neg", "lambda_neg")  # its Gamma weight's shapes: algorithm.vespo_<name>

#: The built-in losses by `algorithm.loss` name; `forge_nb.live.builtin.builtin_loss` makes loss v0 from one.
#: Dr.GRPO divides by B x engine.max_tokens (a constant), as the paper and TRL do. "aipo" is CISPO's loss (its
#: older name here).
LOSSES: dict[str, BuiltinLoss] = {
    "grpo": BuiltinLoss(grpo_loss, {"clip_eps": "clip_eps", "token_level": "token_level"}, _ASYMMETRIC, _MODIFIERS),
    "dr_grpo": BuiltinLoss(dr_grpo_loss, {"clip_eps": "clip_eps", "max_tokens": "max_tokens"}, _ASYMMETRIC, _MODIFIERS),
    "dapo": BuiltinLoss(dapo_loss, {"clip_low": "clip_eps", "clip_high": "upper_clip"}, _CLIPPED, _MODIFIERS),
    "cispo": BuiltinLoss(cispo_loss, {"rho_max": "rho_max"}, {}, _MODIFIERS),
    "aipo": BuiltinLoss(cispo_loss, {"rho_max": "rho_max"}, {}, _MODIFIERS),
    "sapo": BuiltinLoss(sapo_loss, {"tau_pos": "sapo_tau_pos", "tau_neg": "sapo_tau_neg"}, {}, _MODIFIERS),
    "luspo": BuiltinLoss(luspo_loss, {"clip_eps": "clip_eps"}, _ASYMMETRIC, _MODIFIERS),
    "vespo": BuiltinLoss(vespo_loss, {k: f"vespo_{k}" for k in _VESPO}, {}, _MODIFIERS),
}
