"""One optimizer step of a policy-gradient loss on a `TokenBatch` (plain PyTorch)."""

from __future__ import annotations

import inspect
from collections.abc import Callable

import torch
from torch import nn

from forge_nb.rl.batch import TokenBatch, token_logprobs
from forge_nb.rl.losses import kl_k3, masked_mean


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


def policy_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    loss_fn: LossFn,
    temperature: float = 1.0,
    max_grad_norm: float = 1.0,
    check_loss: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
    skip_zero_advantage: bool = False,
) -> dict[str, float]:
    """Forward, loss, backward, clip, step -> metrics (loss, grad_norm, ratio stats, tokens).

    `check_loss(loss)` runs before backward (it raises to refuse the value). A non-finite gradient
    raises `NonFiniteGradient` before the optimizer steps, so the weights are never touched.
    `skip_zero_advantage`: only for a loss that is 0, with no gradient, on a sequence whose
    advantage is 0 (see `LiveCode.zero_advantage_inert`); such sequences are not run through the
    model, which leaves the loss and the gradient as they were. The ratio metrics then cover the
    sequences that ran; `rows_skipped` counts the others.
    """
    model.train()
    logprobs, ran = _logprobs(model, batch, temperature, skip_zero_advantage)  # [B, T], [B] bool
    mask = batch.completion_mask
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
            "tokens": int(batch.completion_mask.sum().item()),
            "rows_skipped": int((~ran).sum().item()),
        }


def _logprobs(
    model: nn.Module, batch: TokenBatch, temperature: float, skip_zero_advantage: bool
) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (logprobs [B, T], which rows ran through the model [B] bool). Rows left out get their
    behaviour logprobs as constants: ratio 1, and no path to the weights."""
    ran = batch.advantages != 0 if skip_zero_advantage else torch.ones_like(batch.advantages, dtype=torch.bool)
    # Nothing to skip; or nothing would run: then all run, and the step is what it always was (a zero
    # gradient, on which AdamW still moves by its moments).
    if bool(ran.all()) or not bool(ran.any()):
        return token_logprobs(model, batch, temperature), torch.ones_like(ran)
    rows = ran.nonzero()[:, 0]
    picked = token_logprobs(model, batch.select(rows), temperature)
    return batch.old_logprobs.index_put((rows,), picked), ran
