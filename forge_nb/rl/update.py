"""One optimizer step of a policy-gradient loss on a batch (plain PyTorch).

The batch is a `rl.prefix_batch.PrefixBatch` (what the trainer uses: each prompt runs once for its
group) or a `rl.batch.TokenBatch` (full sequences); both give per-token tensors [B, T] and a
`logprobs(model, temperature)` of the same layout, and the loss does not care which.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from forge_nb.rl import entropy
from forge_nb.rl.batch import TokenBatch
from forge_nb.rl.losses import kl_k3, log_ratio, masked_mean
from forge_nb.rl.prefix_batch import PrefixBatch
from forge_nb.rl.split import ONE_RANK, Plan, Split, plan


class NonFiniteGradient(FloatingPointError):
    """The loss's gradient is NaN or inf; no optimizer step was taken."""


# (logprobs, old_logprobs, advantages, mask[, ref_logprobs][, entropies]) -> scalar
LossFn = Callable[..., torch.Tensor]


def _as_is(loss: torch.Tensor) -> torch.Tensor:
    return loss


def takes_ref(loss_fn: LossFn) -> bool:
    """Whether `loss_fn` accepts ``ref_logprobs`` (by name, or through ``**kwargs``)."""
    try:
        params = inspect.signature(loss_fn).parameters.values()
    except (TypeError, ValueError):
        return False
    return any(p.name == "ref_logprobs" or p.kind is p.VAR_KEYWORD for p in params)


def takes_entropies(loss_fn: LossFn) -> bool:
    """Whether `loss_fn` names an ``entropies`` parameter (the policy's per-token entropy [B, T]; only by name:
    computing it costs a pass over the vocabulary, and a ``**kwargs`` loss did not ask for it)."""
    try:
        return "entropies" in inspect.signature(loss_fn).parameters
    except (TypeError, ValueError):
        return False


def needs_ref(loss_fn: LossFn) -> bool:
    """Whether `loss_fn` cannot run without ``ref_logprobs`` (a parameter of that name, no default)."""
    try:
        param = inspect.signature(loss_fn).parameters.get("ref_logprobs")
    except (TypeError, ValueError):
        return False
    return param is not None and param.default is param.empty


@dataclass(frozen=True)
class UpdateOptions:
    """How `policy_update` runs: the sampling `temperature` the logprobs are taken at; `max_grad_norm` (the global
    norm the gradients are clipped to); `check_loss(loss)`, run before backward (it raises to refuse the value);
    `skip_zero_advantage` (only for a loss that is inert there: see `policy_update`); `split` over ranks and
    micro-batches (`rl.split`); the `clip` range and `ratio_level` the `clip_fraction` metric counts against (the
    trainer passes `AlgorithmConfig.metric_clip` and `ratio_level`); `with_entropy`: the entropy metric."""

    temperature: float = 1.0
    max_grad_norm: float = 1.0
    check_loss: Callable[[torch.Tensor], torch.Tensor] = _as_is
    skip_zero_advantage: bool = False
    split: Split = ONE_RANK
    clip: tuple[float, float] = (0.2, 0.2)
    with_entropy: bool = True
    ratio_level: str = "token"


def policy_update(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    batch: PrefixBatch | TokenBatch,
    loss_fn: LossFn,
    options: UpdateOptions = UpdateOptions(),
) -> tuple[dict[str, float], torch.Tensor]:
    """Forward, loss, backward, clip, step -> (metrics: loss, grad_norm, ratio stats, tokens, entropy; the
    policy's logprobs of the batch's tokens before the step [B, T], detached: for rows left out, their
    behaviour logprobs).

    Read on the policy's own tokens (the loss mask) before the step: `entropy`, the policy's mean entropy
    per token (nats, at ``logits / temperature``: `rl.entropy`); `clip_fraction`, the share of tokens the
    clip takes the gradient from: ratio to the behaviour policy below ``1 - clip[0]`` with a negative advantage,
    or above ``1 + clip[1]`` with a positive one (the trainer passes `AlgorithmConfig.metric_clip`; TRL's and verl's
    count; ~0 on-policy, it grows with staleness; at ``ratio_level="sequence"``, GSPO's, the share of sequences
    whose ratio, ``exp`` of their mean log-ratio, is outside, as TRL counts it); `response_length` and
    `response_length_max`, the policy tokens per sequence (a completion left out of the loss counted too).
    `with_entropy` False: no entropy (NaN), and no pass over the vocabulary for it, unless the loss names
    ``entropies``: it gets (a copy of) the policy's per-token entropy of the whole batch [B, T] (detached; 0 on
    rows that did not run), as it gets ``ref_logprobs``, and the metric is reported then too.

    The loss always sees the whole batch: `loss_fn` runs once, on the logprobs of every row, with the
    whole batch's normaliser, whatever `options.split` says. Split over ranks and micro-batches (`rl.split`),
    each rank runs its rows through the model and the ranks sum those logprobs (`split.sum_across`);
    then with one micro-batch per rank, the loss's backward reaches each rank's own rows and stops at
    the others' (summed over ranks, that is the whole batch's gradient: a gang sums its gradients,
    `parallel.fsdp`); with several, the logprobs come from a first pass without a graph, the loss's
    gradient with respect to them, G [B, T], is taken once, and each micro-batch is run again and
    back-propagated with its rows of G (the same gradient by the chain rule, one extra forward,
    activations of one micro-batch at a time).

    `check_loss(loss)` runs before backward (it raises to refuse the value). A non-finite gradient
    raises `NonFiniteGradient` before the optimizer steps, so the weights are never touched.
    `skip_zero_advantage`: only for a loss that is 0, with no gradient, on a sequence whose
    advantage is 0 or whose loss mask is empty (see `LiveCode.zero_advantage_inert`); such sequences are
    not run through the model, which leaves the loss and the gradient as they were. The ratio metrics then cover the
    sequences that ran; `rows_skipped` counts the others. With every advantage 0 the gradient is
    exactly 0: the optimizer steps on zero gradients (AdamW still moves by its moments) with no
    forward at all.
    """
    o = options
    model.train()
    ran = torch.ones_like(batch.advantages, dtype=torch.bool)
    if o.skip_zero_advantage:
        ran = (batch.advantages != 0) & (batch.loss_mask.sum(1) > 0)
        if not bool(ran.any()):
            return _zero_gradient_step(model, optimizer, batch), batch.old_logprobs
    work = plan(batch, ran, o.split)
    extra = {"ref_logprobs": batch.ref_logprobs} if batch.ref_logprobs is not None and takes_ref(loss_fn) else {}
    optimizer.zero_grad(set_to_none=True)
    wanted = takes_entropies(loss_fn)
    entropies = torch.zeros_like(batch.old_logprobs) if o.with_entropy or wanted else None
    if wanted:
        extra["entropies"] = entropies  # filled in (over every rank) before the loss runs, then a copy is passed
    passes = _one_pass if work.count == 1 else _two_passes
    loss, logprobs = passes(model, batch, work, ran, o, loss_fn, extra, entropies)
    grad_norm = clip_gradients(model, o.max_grad_norm, o.split)
    if not torch.isfinite(grad_norm):
        optimizer.zero_grad(set_to_none=True)
        raise NonFiniteGradient(f"backward produced a non-finite gradient norm ({grad_norm.item()})")
    optimizer.step()
    metrics = update_metrics(batch, logprobs, ran, entropies, o)
    return {"loss": loss.item(), "grad_norm": grad_norm.item(), **metrics, "micro_batches": work.count}, logprobs


def accumulate(
    model: nn.Module, batch, loss_fn: LossFn, options: UpdateOptions = UpdateOptions()
) -> tuple[torch.Tensor, torch.Tensor]:
    """Forward, loss, backward, and no optimizer step: the loss's gradient is added to each trainable
    parameter's ``.grad`` (gradient accumulation: Tinker's `forward_backward`, the step comes with its
    `optim_step`) -> (the loss, detached; the batch's logprobs [B, T], detached). Every row runs; the split
    over ranks and micro-batches, and the loss seeing the whole batch, are `policy_update`'s. `batch` is any
    batch `rl.split` can plan (a `rl.target_batch.TargetBatch`: `loss_fn` reads its inputs itself)."""
    model.train()
    ran = torch.ones_like(batch.advantages, dtype=torch.bool)
    work = plan(batch, ran, options.split)
    passes = _one_pass if work.count == 1 else _two_passes
    return passes(model, batch, work, ran, options, loss_fn, {}, None)


@torch.no_grad()
def update_metrics(
    batch: PrefixBatch | TokenBatch,
    logprobs: torch.Tensor,
    ran: torch.Tensor,
    entropies: torch.Tensor | None,
    options: UpdateOptions,
) -> dict[str, float]:
    """What the update read on the policy's own tokens before its step (`policy_update`'s docstring):
    `logprobs` [B, T] the policy's, `ran` [B] the rows that ran, `entropies` [B, T] or None."""
    mask = batch.loss_mask * ran[:, None]  # the policy's own tokens (multi-turn: not tool results) that ran
    lengths = batch.policy_tokens.sum(1)  # (a completion left out of the loss has its length still)
    diff = (logprobs - batch.old_logprobs) * mask
    ratio = log_ratio(logprobs, batch.old_logprobs, mask, options.ratio_level).exp()  # [B, T] or [B, 1]
    advantage = batch.advantages[:, None]
    # What the clip fraction is a share of: tokens, or (GSPO) the sequences with a token.
    over = (mask.sum(1, keepdim=True) > 0).float() if options.ratio_level == "sequence" else mask
    # Clipped where the clip takes the gradient away, as TRL's and verl's clip fractions count it.
    low, high = options.clip
    clipped = (((ratio < 1 - low) & (advantage < 0)) | ((ratio > 1 + high) & (advantage > 0))).to(mask.dtype)
    ref = {}
    if batch.ref_logprobs is not None:  # k3 KL(policy || reference) on the batch's tokens, before the step
        ref["kl_ref"] = masked_mean(kl_k3(logprobs, batch.ref_logprobs), mask).item()
    return {
        **ref,
        # k1 estimate of KL(behaviour || policy) on the batch's own tokens: the generator-trainer gap before this
        # step (0 on-policy up to numerics; it can be negative), not how far the step moved the policy.
        "approx_kl": masked_mean(-diff, mask).item(),
        "max_abs_logprob_diff": diff.abs().max().item(),
        "entropy": masked_mean(entropies, mask).item() if entropies is not None else float("nan"),
        "clip_fraction": masked_mean(clipped, over).item(),
        "response_length": lengths.float().mean().item(),
        "response_length_max": int(lengths.max().item()),
        "tokens": int(batch.loss_mask.sum().item()),
        "rows_skipped": int((~ran).sum().item()),
    }


def _one_pass(model, batch, work, ran, options, loss_fn, extra, entropies):
    """One micro-batch on this rank: its logprobs keep their graph; the other ranks' rows join as
    constants -> (loss, the whole batch's logprobs [B, T] detached), backward done; `entropies` filled in
    (every rank's rows) before the loss runs."""
    split, temperature = options.split, options.temperature
    rows = work.micro_batches[0] if work.micro_batches else None
    mine = _run(model, batch, rows, temperature, entropies)
    extra = _with_entropies(extra, entropies, split)
    values = torch.zeros_like(batch.old_logprobs)
    if rows is not None:
        values[rows] = mine.detach().to(values.dtype)
    full = _gathered(values, batch, ran, split)
    if rows is not None:
        logprobs = full.index_put((rows,), mine.to(full.dtype))
    else:  # a filler: the loss must still be a loss of logprobs (its checks refuse a constant), on every rank
        logprobs = full.clone().requires_grad_(True)
    loss = options.check_loss(loss_fn(logprobs, batch.old_logprobs, batch.advantages, batch.loss_mask, **extra))
    (loss if rows is not None else loss + (mine * 0).sum()).backward()
    return loss.detach(), full


def _two_passes(model, batch, work, ran, options, loss_fn, extra, entropies):
    """Several micro-batches: logprobs without a graph, the loss's gradient G with respect to them, then
    each micro-batch again, back-propagated with its rows of G -> (loss, logprobs [B, T] detached);
    `entropies` filled in (every rank's rows) by the first pass."""
    split, temperature = options.split, options.temperature
    with torch.no_grad():
        full = _gathered(_pass(model, batch, work, temperature, entropies), batch, ran, split)
    extra = _with_entropies(extra, entropies, split)
    leaf = full.clone().requires_grad_(True)
    loss = options.check_loss(loss_fn(leaf, batch.old_logprobs, batch.advantages, batch.loss_mask, **extra))
    (grad,) = torch.autograd.grad(loss, leaf)
    for i in range(work.count):
        rows = work.micro_batches[i] if i < len(work.micro_batches) else None
        lp = _run(model, batch, rows, temperature)
        (lp * (grad[rows] if rows is not None else 0.0)).sum().backward()
    return loss.detach(), full


def _with_entropies(extra: dict, entropies: torch.Tensor | None, split: Split) -> dict:
    """Every rank's rows of `entropies` summed into the whole batch's (in place, for the metric) -> the loss's
    keyword arguments, with a copy of them if it takes them (what a loss does to its arguments stays there)."""
    if entropies is None:
        return extra
    split.sum_across(entropies)
    return {**extra, "entropies": entropies.clone()} if "entropies" in extra else extra


@torch.no_grad()
def forward_logprobs(
    model: nn.Module, batch: PrefixBatch | TokenBatch, split: Split = ONE_RANK, temperature: float = 1.0
) -> torch.Tensor:
    """Logprobs of every row of `batch` [B, T] without a graph, each rank running its part in
    micro-batches (`split`) and the parts summed over the ranks."""
    ran = torch.ones_like(batch.advantages, dtype=torch.bool)
    values = _pass(model, batch, plan(batch, ran, split), temperature)
    split.sum_across(values)
    return values


def _pass(
    model: nn.Module,
    batch: PrefixBatch | TokenBatch,
    work: Plan,
    temperature: float,
    entropies: torch.Tensor | None = None,
) -> torch.Tensor:
    """This rank's micro-batches (and fillers) through the model -> [B, T], 0 on the other ranks' rows."""
    values = torch.zeros_like(batch.old_logprobs)
    for i in range(work.count):
        rows = work.micro_batches[i] if i < len(work.micro_batches) else None
        lp = _run(model, batch, rows, temperature, entropies)
        if rows is not None:
            values[rows] = lp.to(values.dtype)
    return values


def _run(
    model: nn.Module,
    batch: PrefixBatch | TokenBatch,
    rows: torch.Tensor | None,
    temperature: float,
    entropies: torch.Tensor | None = None,
):
    """Logprobs of `rows` ([K] long) -> [K, T]; `rows` None: a zero-gradient filler (the first row) that
    makes the same model calls, for a rank with fewer micro-batches than the busiest. With `entropies`
    [B, T], the rows' per-token entropy goes there (`rl.entropy`)."""
    whole = rows is not None and len(rows) == len(batch.advantages)  # every row, in order: no copy
    picked = batch if whole else batch.select(rows if rows is not None else torch.zeros(1, dtype=torch.long))
    if entropies is None or rows is None:
        return picked.logprobs(model, temperature)
    with entropy.taking() as taken:
        lp = picked.logprobs(model, temperature)
    entropies[rows] = taken[-1].to(entropies.dtype)
    return lp


def _gathered(values: torch.Tensor, batch, ran: torch.Tensor, split: Split) -> torch.Tensor:
    """Every rank's rows of logprobs summed into one [B, T] (each row is 0 on all ranks but its own);
    rows that did not run keep their behaviour logprobs."""
    split.sum_across(values)
    return torch.where(ran[:, None], values, batch.old_logprobs)


def clip_gradients(model: nn.Module, max_norm: float, split: Split = ONE_RANK) -> torch.Tensor:
    """Scale the gradients so that their global L2 norm is at most `max_norm` -> that norm before
    scaling (float64). The squares are summed in float64, over this rank's shards and then over the
    ranks (`split.sum_across`), so the norm, and the scale, do not depend on how the model is sharded:
    a gang's step equals one proc's bit for bit where its gradients do (AdamW divides each gradient by
    its own size, so a scale that differed in its last bit moved near-zero coordinates by up to lr)."""
    grads = [_local(p.grad) for p in model.parameters() if p.grad is not None]
    if not grads:
        return torch.zeros((), dtype=torch.float64)
    squares = torch.stack([torch.sum(g * g, dtype=torch.float64) for g in grads]).sum()
    split.sum_across(squares)
    norm = squares.sqrt()
    scale = (max_norm / (norm + 1e-6)).clamp(max=1.0)
    if scale < 1.0:
        for g in grads:
            g.mul_(scale.to(g.dtype))
    return norm


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's own part on this rank (a view: writes reach the shard); a tensor as it is."""
    return tensor.to_local() if hasattr(tensor, "to_local") else tensor


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
    stats = {"loss": 0.0, "grad_norm": 0.0, "approx_kl": 0.0, "max_abs_logprob_diff": 0.0, "clip_fraction": 0.0}
    lengths = batch.policy_tokens.sum(1).float()
    longest = int(lengths.max().item()) if rows else 0
    length = {"response_length": lengths.mean().item() if rows else float("nan"), "response_length_max": longest}
    # No forward ran: the entropy is not known this step.
    return {**stats, **length, "entropy": float("nan"), "tokens": tokens, "rows_skipped": rows, "micro_batches": 0}
