"""One optimizer step of a policy-gradient loss on a batch (plain PyTorch).

The batch is a `rl.prefix_batch.PrefixBatch` (what the trainer uses: each prompt runs once for its
group) or a `rl.batch.TokenBatch` (full sequences); both give per-token tensors [B, T] and a
`logprobs(model, temperature)` of the same layout, and the loss does not care which.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from forge_nb.rl.batch import TokenBatch
from forge_nb.rl.losses import kl_k3, masked_mean
from forge_nb.rl.prefix_batch import PrefixBatch


class NonFiniteGradient(FloatingPointError):
    """The loss's gradient is NaN or inf; no optimizer step was taken."""


LossFn = Callable[..., torch.Tensor]  # (logprobs, old_logprobs, advantages, mask[, ref_logprobs]) -> scalar


def takes_ref(loss_fn: LossFn) -> bool:
    """Whether `loss_fn` accepts ``ref_logprobs`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "ref_logprobs" or p.kind is p.VAR_KEYWORD for p in params)


def needs_ref(loss_fn: LossFn) -> bool:
    """Whether `loss_fn` cannot run without ``ref_logprobs`` (a parameter of that name, no default)."""
    try:
        param = inspect.signature(loss_fn).parameters.get("ref_logprobs")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is param.empty


def policy_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PrefixBatch | TokenBatch,
    loss_fn: LossFn,
    temperature: float = 1.0,
    max_grad_norm: float = 1.0,
    check_loss: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
    skip_zero_advantage: bool = False,
) -> tuple[dict[str, float], torch.Tensor]:
    """Forward, loss, backward, clip, step -> (metrics: loss, grad_norm, ratio stats, tokens; the policy's
    logprobs of the batch's tokens before the step [B, T], detached: for rows left out, their behaviour
    logprobs).

    `check_loss(loss)` runs before backward (it raises to refuse the value). A non-finite gradient
    raises `NonFiniteGradient` before the optimizer steps, so the weights are never touched.
    `skip_zero_advantage`: only for a loss that is 0, with no gradient, on a sequence whose
    advantage is 0 (see `LiveCode.zero_advantage_inert`); such sequences are not run through the
    model, which leaves the loss and the gradient as they were. The ratio metrics then cover the
    sequences that ran; `rows_skipped` counts the others. With every advantage 0 the gradient is
    exactly 0: the optimizer steps on zero gradients (AdamW still moves by its moments) with no
    forward at all.
    """
    model.train()
    if skip_zero_advantage and not bool((batch.advantages != 0).any()):
        return _zero_gradient_step(model, optimizer, batch), batch.old_logprobs
    logprobs, ran = _logprobs(model, batch, temperature, skip_zero_advantage)  # [B, T], [B] bool
    mask = batch.loss_mask  # the policy's own tokens (multi-turn: not tool results or environment messages)
    extra = {"ref_logprobs": batch.ref_logprobs} if batch.ref_logprobs is not None and takes_ref(loss_fn) else {}
    loss = check_loss(loss_fn(logprobs, batch.old_logprobs, batch.advantages, mask, **extra))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteGradient(f"backward produced a non-finite gradient norm ({grad_norm.item()})")
    optimizer.step()
    with torch.no_grad():
        mask = mask * ran[:, None]
        log_ratio = (logprobs - batch.old_logprobs) * mask
        ref = {}
        if batch.ref_logprobs is not None:  # k3 KL(policy || reference) on the batch's tokens, before the step
            ref["kl_ref"] = masked_mean(kl_k3(logprobs, batch.ref_logprobs), mask).item()
        return {
            **ref,
            "loss": loss.item(),
            "grad_norm": grad_norm.item(),
            # k1 estimate of KL(behaviour || current) on the batch's own tokens.
            "approx_kl": masked_mean(-log_ratio, mask).item(),
            "max_abs_logprob_diff": log_ratio.abs().max().item(),
            "tokens": int(batch.loss_mask.sum().item()),
            "rows_skipped": int((~ran).sum().item()),
        }, logprobs.detach()


def _zero_gradient_step(model: nn.Module, optimizer: torch.optim.Optimizer, batch) -> dict[str, float]:
    """The step a batch of zero advantages takes under an inert loss, without computing it: every
    gradient is 0, as backward would have made it (so every parameter's optimizer state moves)."""
    optimizer.zero_grad(set_to_none=True)
    for p in model.parameters():
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    optimizer.step()
    rows = int(batch.advantages.numel())
    tokens = int(batch.loss_mask.sum().item())
    stats = {"loss": 0.0, "grad_norm": 0.0, "approx_kl": 0.0, "max_abs_logprob_diff": 0.0}
    return {**stats, "tokens": tokens, "rows_skipped": rows}


def _logprobs(
    model: nn.Module, batch: PrefixBatch | TokenBatch, temperature: float, skip_zero_advantage: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (logprobs [B, T], which rows ran through the model [B] bool). Rows left out get their
    behaviour logprobs as constants: ratio 1, and no path to the weights."""
    ran = batch.advantages != 0 if skip_zero_advantage else torch.ones_like(batch.advantages, dtype=torch.bool)
    if bool(ran.all()):
        return batch.logprobs(model, temperature), torch.ones_like(ran)
    rows = ran.nonzero()[:, 0]
    picked = batch.select(rows).logprobs(model, temperature)
    return batch.old_logprobs.index_put((rows,), picked), ran
