"""Token batches for training: collate prompt+completion ids and score them under a model.

Shapes: B sequences, L = longest prompt+completion; per-token tensors are [B, L-1] and aligned with
*next-token* targets, so position t holds the logprob of ``input_ids[:, t + 1]``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

import torch
from torch import nn

from forge_nb.rl import entropy
from forge_nb.rl.episode import Episode
from forge_nb.rl.prefix_batch import PrefixBatch, collate_prefix


@dataclass
class TokenBatch:
    input_ids: torch.Tensor  # [B, L] long, right-padded prompt + completion
    attention_mask: torch.Tensor  # [B, L] long, 1 on real tokens
    completion_mask: torch.Tensor  # [B, L-1] float, 1 where the target token was generated
    old_logprobs: torch.Tensor  # [B, L-1] float, behaviour-policy logprobs (0 outside the mask)
    advantages: torch.Tensor  # [B] float, one per sequence
    ref_logprobs: torch.Tensor | None = None  # [B, L-1] float, reference-model logprobs (when a reference runs)
    policy_mask: torch.Tensor | None = None  # [B, L-1] float, multi-turn: 1 on the policy's own tokens
    loss_rows: torch.Tensor | None = None  # [B] float, 0 on a completion left out of the loss (mask_truncated)

    @property
    def policy_tokens(self) -> torch.Tensor:
        """[B, L-1]: the policy's own tokens (every generated token of a single completion)."""
        return self.completion_mask if self.policy_mask is None else self.completion_mask * self.policy_mask

    @property
    def loss_mask(self) -> torch.Tensor:
        """[B, L-1]: the tokens the loss and its statistics see (the model attends to every real token)."""
        return self.policy_tokens if self.loss_rows is None else self.policy_tokens * self.loss_rows[:, None]

    def select(self, rows: torch.Tensor) -> TokenBatch:
        """The sequences at `rows` ([K] long), same width."""
        picked = {k: (v[rows] if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TokenBatch(**picked)

    def to(self, device: torch.device | str) -> TokenBatch:
        """The same batch with every tensor on `device`."""
        moved = {k: (v.to(device) if isinstance(v, torch.Tensor) else v) for k, v in self.__dict__.items()}
        return TokenBatch(**moved)

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """Logprob of every next token under ``logits / temperature`` -> [B, L-1] (0 where masked out)."""
        return token_logprobs(model, self, temperature)


@dataclass(frozen=True)
class TrainBatch:
    """B sequences to train on, as lists: what travels from the kernel to the trainer.

    `logprobs` are the behaviour policy's (the generator's), `ref_logprobs` the reference model's
    (None without one); both per completion token.
    """

    prompt_ids: list[list[int]]
    completion_ids: list[list[int]]
    logprobs: list[list[float]]
    advantages: list[float]
    ref_logprobs: list[list[float]] | None = None
    policy_masks: list[list[int]] | None = None  # multi-turn: 1 on the policy's own completion tokens
    keep_logprobs: bool = True  # answer with the trainer's per-token logprobs (the rollout log's)
    loss_rows: list[int] | None = None  # 0: the completion is left out of the loss (mask_truncated)

    @classmethod
    def of(
        cls,
        episodes: Sequence[Episode],
        with_reference: bool = False,
        keep_logprobs: bool = True,
        mask_truncated: bool = False,
    ) -> TrainBatch:
        """The batch of `episodes`; `mask_truncated`: a completion cut at max_tokens (finish_reason "length")
        is left out of the loss (`loss_rows`; its reward still counts in its group's advantages). `with_reference`:
        every episode carries its reference logprobs (the step attaches them as it scores: `step.rollout`)."""
        missing = [e.sample_id for e in episodes if with_reference and e.ref_logprobs is None]
        if missing:
            raise ValueError(f"samples {missing[:8]} have no reference logprobs (made by step.rollout)")
        multi_turn = any(e.completion_mask is not None for e in episodes)
        cut = [int(e.finish_reason != "length") for e in episodes] if mask_truncated else None
        return cls(
            [e.prompt_ids for e in episodes],
            [e.completion_ids for e in episodes],
            [e.logprobs for e in episodes],
            [e.advantage for e in episodes],
            [e.ref_logprobs for e in episodes] if with_reference else None,
            [e.completion_mask or [1] * e.num_tokens for e in episodes] if multi_turn else None,
            keep_logprobs,
            cut if cut is not None and not all(cut) else None,
        )

    def __len__(self) -> int:
        return len(self.prompt_ids)

    def rows(self, start: int, stop: int) -> TrainBatch:
        """The sequences `start`..`stop` - 1 (every per-row list cut the same way, as `TokenBatch.select` cuts
        its tensors)."""
        cut = {k: v[start:stop] for k, v in self.__dict__.items() if isinstance(v, list)}
        return replace(self, **cut)

    def collate(self, pad_id: int, full_sequences: bool = False) -> PrefixBatch | TokenBatch:
        """Tensors for the trainer: each distinct prompt once (`rl.prefix_batch`), or with
        `full_sequences` every prompt + completion whole (what activation checkpointing needs: the
        prefix layout's completion pass extends a key/value cache that a recomputation would extend twice)."""
        return (collate if full_sequences else collate_prefix)(
            self.prompt_ids,
            self.completion_ids,
            pad_id,
            self.logprobs,
            self.advantages,
            self.ref_logprobs,
            self.policy_masks,
            self.loss_rows,
        )


def collate(
    prompt_ids: list[list[int]],
    completion_ids: list[list[int]],
    pad_id: int,
    old_logprobs: list[list[float]] | None = None,
    advantages: list[float] | None = None,
    ref_logprobs: list[list[float]] | None = None,
    policy_masks: list[list[int]] | None = None,
    loss_rows: list[int] | None = None,
) -> TokenBatch:
    """Right-pad prompt+completion pairs into one `TokenBatch` (missing logprobs/advantages are 0;
    `ref_logprobs`, `policy_masks` and `loss_rows` stay None unless given)."""
    prompt_len = torch.tensor([len(p) for p in prompt_ids])
    total = prompt_len + torch.tensor([len(c) for c in completion_ids])
    batch, width = len(prompt_ids), int(total.max())
    # Vectorised (one Python pass to flatten, then masks): a per-row loop of small tensor writes
    # took ~6 ms of the trainer's step for 256 rows.
    positions = torch.arange(width)
    attention_mask = (positions < total[:, None]).long()
    input_ids = torch.full((batch, width), pad_id, dtype=torch.long)
    input_ids[attention_mask.bool()] = torch.tensor([t for p, c in zip(prompt_ids, completion_ids) for t in p + c])
    # The logit at position len(p) - 1 predicts the first completion token.
    targets = positions[:-1] + 1
    completion = (targets >= prompt_len[:, None]) & (targets < total[:, None])
    completion_mask = completion.float()
    old = _scatter(completion, old_logprobs, completion_ids)
    ref = _scatter(completion, ref_logprobs, completion_ids) if ref_logprobs is not None else None
    policy = _scatter(completion, policy_masks, completion_ids) if policy_masks is not None else None
    adv = torch.tensor(advantages if advantages is not None else [0.0] * batch, dtype=torch.float32)
    rows = torch.tensor(loss_rows, dtype=torch.float32) if loss_rows is not None else None
    return TokenBatch(input_ids, attention_mask, completion_mask, old, adv, ref, policy, rows)


def _scatter(where: torch.Tensor, values: list[list[float]] | None, completion_ids: list[list[int]]) -> torch.Tensor:
    """Per-completion-token values (each row cut to its completion's length) into a [B, L-1] tensor
    that is 0 outside `where`."""
    out = torch.zeros(where.shape)
    if values is not None:
        out[where] = torch.tensor([v for row, c in zip(values, completion_ids) for v in row[: len(c)]], dtype=out.dtype)
    return out


def token_logprobs(model: nn.Module, batch: TokenBatch, temperature: float = 1.0) -> torch.Tensor:
    """Logprob of every next token under ``logits / temperature`` -> [B, L-1] (0 where masked out)."""
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits[:, :-1]
    if temperature > 0:
        logits = logits / temperature
    logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # bf16: in fp32
    entropy.note(logp, batch.completion_mask)
    picked = logp.gather(-1, batch.input_ids[:, 1:, None])[..., 0]
    return picked * batch.completion_mask
