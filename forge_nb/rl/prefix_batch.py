"""Training batches that run each prompt once: the G completions of a GRPO group share their prompt's
keys and values, in the forward and in the backward.

A group's G samples repeat one prompt, so a batch of B = P x G sequences of prompt length Lp and
completion length Lc costs the model B x (Lp + Lc) tokens the plain way (`rl.batch.collate`) and
P x Lp + B x Lc here: the prompts run once, their key/value cache is expanded to the rows that
continue them, then the completions run against it. The logprobs are those of the plain way (same
math, up to float rounding: see `tests/rl/test_prefix_batch.py`), and so are the gradients, which
reach each prompt's activations once, summed over its completions.

Shapes: P distinct prompts, left-padded to Lp; B completions, right-padded to Lc. Per-token tensors
are [B, Lc], aligned with the completion tokens: position t holds the logprob of completion token t.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import nn

from forge_nb.padding import left_padded
from forge_nb.rl import entropy


@dataclass
class PrefixBatch:
    prompt_ids: torch.Tensor  # [P, Lp] long, left-padded distinct prompts
    prompt_mask: torch.Tensor  # [P, Lp] long, 1 on real prompt tokens
    prompt_of: torch.Tensor  # [B] long, the prompt each completion continues
    completion_ids: torch.Tensor  # [B, Lc] long, right-padded
    completion_mask: torch.Tensor  # [B, Lc] float, 1 on generated tokens
    old_logprobs: torch.Tensor  # [B, Lc] float, behaviour-policy logprobs (0 outside the mask)
    advantages: torch.Tensor  # [B] float, one per sequence
    ref_logprobs: torch.Tensor | None = None  # [B, Lc] float, reference-model logprobs (when a reference runs)
    # [B, Lc] float, 1 on the policy's own tokens of a multi-turn completion (tool results, environment
    # messages and template glue: 0); None: every completion token is the policy's.
    policy_mask: torch.Tensor | None = None
    loss_rows: torch.Tensor | None = None  # [B] float, 0 on a completion left out of the loss (mask_truncated)

    @property
    def policy_tokens(self) -> torch.Tensor:
        """[B, Lc]: the policy's own tokens (every generated token of a single completion)."""
        return self.completion_mask if self.policy_mask is None else self.completion_mask * self.policy_mask

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, Lc]: the tokens the loss and its statistics see (the model attends to every real token)."""
        return self.policy_tokens if self.loss_rows is None else self.policy_tokens * self.loss_rows[:, None]

    def select(self, rows: torch.Tensor) -> PrefixBatch:
        """The completions at `rows` ([K] long) and only the prompts they continue."""
        used, prompt_of = torch.unique(self.prompt_of[rows], return_inverse=True)
        per_row = {f.name: getattr(self, f.name) for f in fields(self) if f.name not in _PROMPT_FIELDS}
        picked = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in per_row.items()}
        return PrefixBatch(self.prompt_ids[used], self.prompt_mask[used], prompt_of, **picked)

    def to(self, device: torch.device | str) -> PrefixBatch:
        """The same batch with every tensor on `device`."""
        moved = {f.name: getattr(self, f.name) for f in fields(self)}
        return PrefixBatch(**{k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in moved.items()})

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """Logprob of every completion token under ``logits / temperature`` -> [B, Lc] (0 where masked)."""
        return prefix_logprobs(model, self, temperature)


_PROMPT_FIELDS = ("prompt_ids", "prompt_mask", "prompt_of")


def collate_prefix(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    old_logprobs: list[list[float]] | None = None,
    advantages: list[float] | None = None,
    ref_logprobs: list[list[float]] | None = None,
    policy_masks: list[list[int]] | None = None,
    loss_rows: list[int] | None = None,
) -> PrefixBatch:
    """B (prompt, completion) pairs -> a `PrefixBatch` with each distinct prompt once (missing
    logprobs / advantages are 0; `ref_logprobs`, `policy_masks` and `loss_rows` stay None unless given)."""
    index: dict[tuple[int, ...], int] = {}
    prompt_of = torch.tensor([index.setdefault(tuple(p), len(index)) for p in prompt_ids])
    prompts = list(index)
    prompt_tensor, prompt_mask = left_padded(prompts, pad_id)
    sizes = torch.tensor([len(c) for c in completion_ids])
    where = torch.arange(int(sizes.max())) < sizes[:, None]  # right padding
    completions = torch.full(where.shape, pad_id, dtype=torch.long)
    completions[where] = torch.tensor([t for c in completion_ids for t in c], dtype=torch.long)
    advantages = advantages if advantages is not None else [0.0] * len(completion_ids)
    return PrefixBatch(
        prompt_tensor,
        prompt_mask,
        prompt_of,
        completions,
        where.float(),
        _per_token(where, old_logprobs, sizes),
        torch.tensor(advantages, dtype=torch.float32),
        _per_token(where, ref_logprobs, sizes) if ref_logprobs is not None else None,
        _per_token(where, policy_masks, sizes) if policy_masks is not None else None,
        torch.tensor(loss_rows, dtype=torch.float32) if loss_rows is not None else None,
    )


def _per_token(where: torch.Tensor, values: list[list[float]] | None, sizes: torch.Tensor) -> torch.Tensor:
    """Per-completion-token values (each row cut to its completion's length) as [B, Lc], 0 elsewhere."""
    out = torch.zeros(where.shape)
    if values is not None:
        out[where] = torch.tensor([v for row, n in zip(values, sizes.tolist()) for v in row[:n]], dtype=out.dtype)
    return out


def prefix_logprobs(model: nn.Module, batch: PrefixBatch, temperature: float = 1.0) -> torch.Tensor:
    """Completion-token logprobs [B, Lc] with each prompt run once; differentiable through both passes."""
    positions = (batch.prompt_mask.cumsum(-1) - 1).clamp(min=0)
    # Only the last prompt position's logits are needed (they predict completion token 0).
    out = model(
        input_ids=batch.prompt_ids,
        attention_mask=batch.prompt_mask,
        position_ids=positions,
        use_cache=True,
        logits_to_keep=1,
    )
    logits = out.logits[:, -1][batch.prompt_of][:, None]  # [B, 1, V]
    width = batch.completion_ids.shape[1]
    if width > 1:
        cache = out.past_key_values
        cache.batch_select_indices(batch.prompt_of)  # each row continues its prompt's keys and values
        prompt_mask = batch.prompt_mask[batch.prompt_of]
        feed = batch.completion_ids[:, :-1]  # the last token predicts nothing we train on
        mask = torch.cat([prompt_mask, batch.completion_mask[:, :-1].long()], dim=1)
        start = prompt_mask.sum(-1, keepdim=True)
        rest = model(
            input_ids=feed,
            attention_mask=mask,
            position_ids=start + torch.arange(width - 1, device=feed.device),
            past_key_values=cache,
            use_cache=True,
        )
        logits = torch.cat([logits, rest.logits], dim=1)  # [B, Lc, V]: position t predicts completion token t
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # bf16: in fp32
    entropy.note(logp, batch.completion_mask)
    return logp.gather(-1, batch.completion_ids[..., None])[..., 0] * batch.completion_mask


@torch.no_grad()
def completion_logprobs(
    model: nn.Module, prompt_ids: list[list[int]], completion_ids: list[list[int]], pad_id: int, temperature: float
) -> list[list[float]]:
    """Each completion's token logprobs after its prompt under ``logits / temperature`` (no grad)."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    lp = prefix_logprobs(model, collate_prefix(prompt_ids, completion_ids, pad_id).to(device), temperature)
    model.train(was_training)
    return [lp[i, : len(c)].tolist() for i, c in enumerate(completion_ids)]
