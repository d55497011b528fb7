"""One optimizer step of a policy-gradient loss on a `TokenBatch` (plain PyTorch)."""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from forge_nb.rl.batch import TokenBatch, token_logprobs
from forge_nb.rl.losses import masked_mean


class NonFiniteGradient(FloatingPointError):
    """The loss's gradient is NaN or inf; no optimizer step was taken."""


LossFn = Callable[..., torch.Tensor]  # (logprobs, old_logprobs, advantages, mask) -> scalar


def policy_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: TokenBatch,
    loss_fn: LossFn,
    temperature: float = 1.0,
    max_grad_norm: float = 1.0,
    check_loss: Callable[[torch.Tensor], torch.Tensor] = lambda loss: loss,
) -> dict[str, float]:
    """Forward, loss, backward, clip, step -> metrics (loss, grad_norm, ratio stats, tokens).

    `check_loss(loss)` runs before backward (it raises to refuse the value). A non-finite gradient
    raises `NonFiniteGradient` before the optimizer steps, so the weights are never touched.
    """
    model.train()
    logprobs = token_logprobs(model, batch, temperature)  # [B, T]
    mask = batch.completion_mask
    loss = check_loss(loss_fn(logprobs, batch.old_logprobs, batch.advantages, mask))
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    grad_norm = torch.nn.utils.clip_grad_norm_(model.parameters(), max_grad_norm)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteGradient(f"backward produced a non-finite gradient norm ({grad_norm.item()})")
    optimizer.step()
    with torch.no_grad():
        log_ratio = (logprobs - batch.old_logprobs) * mask
        return {
            "loss": loss.item(),
            "grad_norm": grad_norm.item(),
            # k1 estimate of KL(behaviour || current) on the batch's own tokens.
            "approx_kl": masked_mean(-log_ratio, mask).item(),
            "max_abs_logprob_diff": log_ratio.abs().max().item(),
            "tokens": int(mask.sum().item()),
        }
