"""Several optimizer steps per batch: `epochs` passes over it, each split into `mini_batches` (PPO's epochs
and mini-batches: TRL's ``num_iterations`` and ``steps_per_generation``, verl's ``ppo_epochs`` and
``ppo_mini_batch_size``).

A mini-batch is a run of rows with the same prompt (a group's samples, single-turn; an agent's segments have
prompts of their own), in the batch's order, unshuffled: the advantages were computed over the whole batch
before (so a split changes none), and rows with one prompt share its pass through the model
(`rl.prefix_batch`). Every pass uses the same split; every step's ratio is to the behaviour policy, the
generator's logprobs, as PPO's is to the policy that sampled. The loss normalises over its own mini-batch, as
verl's per-mini-batch loss does (TRL shuffles the rows before it splits them, and its token-level losses divide
by the whole generation batch's tokens).

Each step is whole or not at all (`rl.update.policy_update`). If the live loss fails on a step after
the first, the steps before it stay: they were whole steps, on finite gradients, of the loss that was live
(`Trainer.train_step` publishes them and says where the loss failed).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from forge_nb.rl.batch import TrainBatch

Update = Callable[[TrainBatch], tuple[dict[str, float], list[list[float]] | None]]


def groups(batch: TrainBatch) -> list[range]:
    """Runs of consecutive rows with the same prompt (a group of single-turn samples) -> their row ranges."""
    starts = [i for i in range(len(batch)) if i == 0 or batch.prompt_ids[i] != batch.prompt_ids[i - 1]]
    return [range(a, b) for a, b in zip(starts, [*starts[1:], len(batch)])]


def split(batch: TrainBatch, parts: int) -> list[TrainBatch]:
    """`batch` as `parts` mini-batches of whole runs (`groups`), as even in runs as they divide (fewer when the
    batch has fewer runs), in order."""
    found = groups(batch)
    parts = min(parts, len(found))
    if parts <= 1:
        return [batch]
    size, extra = divmod(len(found), parts)
    out, first = [], 0
    for k in range(parts):
        taken = found[first : first + size + (k < extra)]
        first += len(taken)
        out.append(batch.rows(taken[0].start, taken[-1].stop))
    return out


@dataclass
class Steps:
    """What `run` did: each step's metrics, the rows of each mini-batch, the first pass's per-token logprobs of
    every row before its step (None unless `TrainBatch.keep_logprobs`; rows it did not reach keep their
    behaviour logprobs), and the loss's error that stopped the steps early (None: all were taken)."""

    metrics: list[dict[str, float]]
    rows: list[int]
    logprobs: list[list[float]] | None
    error: BaseException | None = None

    def combined(self) -> dict[str, Any]:
        """The batch's metrics (`combine`)."""
        return combine(self.metrics, self.rows)


def run(
    batch: TrainBatch, epochs: int, mini_batches: int, update: Update, failed: tuple[type[BaseException], ...]
) -> Steps:
    """`update` on each mini-batch of `batch` (`split`), `epochs` times. An exception of `failed` on a step
    after the first stops the steps there and is kept (`Steps.error`); on the first step, or any other
    exception, it propagates (nothing was stepped, or it is not the loss's to answer for)."""
    parts = split(batch, mini_batches)
    steps: list[dict[str, float]] = []
    logprobs: list[list[float]] = []
    error = None
    for i, part in enumerate(parts * epochs):
        try:
            metrics, part_logprobs = update(part)
        except failed as e:
            if not steps:
                raise
            error = e
            break
        steps.append(metrics)
        if i < len(parts) and part_logprobs is not None:  # the first pass
            logprobs += part_logprobs
    kept = logprobs + [list(row) for row in batch.logprobs[len(logprobs) :]] if batch.keep_logprobs else None
    return Steps(steps, [len(p) for p in parts], kept, error)


#: How each metric of a step combines over a batch's steps (else: the mean).
PER_BATCH = {"tokens", "rows_skipped"}  # counted over the first pass: each row once
LARGEST = {"max_abs_logprob_diff", "response_length_max", "micro_batches"}


def combine(steps: Sequence[dict[str, Any]], rows: Sequence[int]) -> dict[str, Any]:
    """The metrics of a batch's steps (`rl.update.policy_update`'s, each) as the batch's, with `updates`,
    the steps taken: counts summed over the first pass (`rows`: the rows of each of its mini-batches),
    response_length weighted by those rows, maxima the largest, the rest the mean over the steps that have a
    value (loss, grad_norm, approx_kl, clip_fraction, entropy, kl_ref: TRL logs the mean of its steps too).
    One step: its metrics as they are."""
    if len(steps) == 1:
        return {**steps[0], "updates": 1}
    first, rows = steps[: len(rows)], rows[: len(steps)]
    out: dict[str, Any] = {}
    for name in dict.fromkeys(k for s in steps for k in s):  # (a step that ran no forward has no kl_ref)
        values = [s[name] for s in steps if name in s and not math.isnan(s[name])]
        if name in PER_BATCH:
            out[name] = sum(s.get(name, 0) for s in first)
        elif name == "response_length":
            out[name] = sum(s[name] * n for s, n in zip(first, rows)) / sum(rows)
        elif name in LARGEST:
            out[name] = max(values) if values else math.nan
        else:
            out[name] = sum(values) / len(values) if values else math.nan
    return {**out, "updates": len(steps)}
