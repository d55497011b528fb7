"""Tinker's datums as a training batch: every position of a model input predicts a target token of its own.

A Tinker datum is a model input x of N tokens, ``target_tokens`` y of N tokens (position t predicts y[t] after
x[: t + 1]; usually y is x shifted by one, but it need not be) and the loss's float inputs of N values each
(``weights``, ``logprobs``, ``advantages``, ...). `Datums` is what travels to the trainer (lists, as
`rl.batch.TrainBatch`); `TargetBatch` their tensors, right-padded:

    input_ids, attention_mask, target_ids, loss_mask   [B, T]
    inputs[name]                                       [B, T] float, 0 on padding

`TargetBatch` has what `rl.update`'s passes and `rl.split` read of a batch (`input_ids` for the cost of a row,
`select`, `logprobs(model, temperature)`, `loss_mask`, and the [B, T] / [B] shapes of `old_logprobs` and
`advantages`, which are zeros here: Tinker's losses take the sampler's logprobs and per-token advantages as
inputs of their own), so a Tinker `forward_backward` splits over a trainer gang and into micro-batches as a
GRPO step does.

Datums that share a prefix (an RL client's G samples of one prompt: consecutive datums whose first
`MIN_SHARED` or more tokens agree) run it once: `SharedPrefixBatch`, as `rl.prefix_batch` runs a group's prompt
once. Its per-token tensors keep the plain layout (datum i's N_i positions in row i), so the losses and the
answers do not see the difference; only the forward does: P distinct prefixes [P, Lp] left-padded, their keys and
values expanded to the B rows, then each row's rest [B, Lr] against them, and each position's logprob gathered
from the prefix pass or the rest pass. The same logprobs and gradients as the plain layout, up to float rounding
(`tests/rl/test_tinker_losses.py`), for P x Lp + B x Lr tokens instead of B x (Lp + Lr).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn

from forge_nb.padding import left_padded

MIN_SHARED = 8  # tokens consecutive datums must share for their prefix to run once


@dataclass(frozen=True)
class Datums:
    """B datums as lists: `tokens[i]` datum i's model input (N_i ids), `targets[i]` its target tokens (N_i
    ids), `inputs[name][i]` its loss input `name` (N_i floats)."""

    tokens: list[list[int]]
    targets: list[list[int]]
    inputs: dict[str, list[list[float]]] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def lengths(self) -> list[int]:
        return [len(t) for t in self.tokens]

    def collate(self, pad_id: int, share_prefixes: bool = True) -> TargetBatch | SharedPrefixBatch:
        """Right-padded tensors of the datums (`pad_id` on padding, which the attention mask hides); a
        `SharedPrefixBatch` when consecutive datums share a prefix (`shared_prefixes`) and `share_prefixes`."""
        lengths = torch.tensor(self.lengths)
        width = int(lengths.max()) if len(lengths) else 0
        real = torch.arange(width)[None, :] < lengths[:, None]  # [B, T]
        input_ids = torch.full(real.shape, pad_id, dtype=torch.long)
        input_ids[real] = torch.tensor([t for row in self.tokens for t in row], dtype=torch.long)
        target_ids = torch.zeros(real.shape, dtype=torch.long)
        target_ids[real] = torch.tensor([t for row in self.targets for t in row], dtype=torch.long)
        inputs = {}
        for name, rows in self.inputs.items():
            values = torch.zeros(real.shape, dtype=torch.float32)
            values[real] = torch.tensor([v for row in rows for v in row], dtype=torch.float32)
            inputs[name] = values
        plain = TargetBatch(input_ids, real.long(), target_ids, real.float(), inputs)
        prefixes = shared_prefixes(self.tokens) if share_prefixes else None
        if prefixes is None:
            return plain
        index: dict[tuple[int, ...], int] = {}
        prompt_of = torch.tensor([index.setdefault(tuple(t[:n]), len(index)) for t, n in zip(self.tokens, prefixes)])
        prompt_ids, prompt_mask = left_padded([list(p) for p in index], pad_id)
        rests = [t[n:] for t, n in zip(self.tokens, prefixes)]
        sizes = torch.tensor([len(r) for r in rests])
        where = torch.arange(int(sizes.max()))[None, :] < sizes[:, None]
        rest_ids = torch.full(where.shape, pad_id, dtype=torch.long)
        rest_ids[where] = torch.tensor([t for r in rests for t in r], dtype=torch.long)
        return SharedPrefixBatch(
            target_ids, real.float(), inputs, prompt_ids, prompt_mask, prompt_of, torch.tensor(prefixes), rest_ids,
            where.float(),
        )  # fmt: skip


def shared_prefixes(tokens: list[list[int]]) -> list[int] | None:
    """Each datum's prefix length, in runs of consecutive datums that share at least `MIN_SHARED` tokens (the
    run's common prefix, each datum keeping one token of its own at least; a datum alone: all but its last
    token) -> the lengths, or None when no two consecutive datums share that much."""
    out, shared, i = [], False, 0
    while i < len(tokens):
        length, j = len(tokens[i]) - 1, i + 1
        while j < len(tokens):
            common = _common(tokens[i], tokens[j])
            if min(length, common, len(tokens[j]) - 1) < MIN_SHARED:
                break
            length, j = min(length, common, len(tokens[j]) - 1), j + 1
        shared |= j - i > 1
        out.extend([length] * (j - i))
        i = j
    return out if shared else None


def _common(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


@dataclass
class TargetBatch:
    input_ids: torch.Tensor  # [B, T] long, right-padded model inputs
    attention_mask: torch.Tensor  # [B, T] long, 1 on real tokens
    target_ids: torch.Tensor  # [B, T] long, the token each position predicts (0 on padding)
    loss_mask: torch.Tensor  # [B, T] float, 1 on every datum's positions
    inputs: dict[str, torch.Tensor] = field(default_factory=dict)  # the loss's inputs, [B, T] float each

    @property
    def old_logprobs(self) -> torch.Tensor:
        """[B, T] zeros: a row that did not run would keep these (every row runs)."""
        return torch.zeros_like(self.loss_mask)

    @property
    def advantages(self) -> torch.Tensor:
        """[B] zeros: the batch's rows, for `rl.update`'s shapes (Tinker's advantages are a loss input)."""
        return torch.zeros(self.loss_mask.shape[0], dtype=self.loss_mask.dtype, device=self.loss_mask.device)

    def select(self, rows: torch.Tensor) -> TargetBatch:
        """The datums at `rows` ([K] long), same width."""
        return TargetBatch(
            self.input_ids[rows],
            self.attention_mask[rows],
            self.target_ids[rows],
            self.loss_mask[rows],
            {k: v[rows] for k, v in self.inputs.items()},
        )

    def to(self, device: torch.device | str) -> TargetBatch:
        return TargetBatch(
            self.input_ids.to(device),
            self.attention_mask.to(device),
            self.target_ids.to(device),
            self.loss_mask.to(device),
            {k: v.to(device) for k, v in self.inputs.items()},
        )

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """Each position's logprob of its target under ``logits / temperature`` -> [B, T] (0 on padding)."""
        logits = model(input_ids=self.input_ids, attention_mask=self.attention_mask).logits
        if temperature > 0 and temperature != 1.0:
            logits = logits / temperature
        logp = torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # bf16: in fp32
        return logp.gather(-1, self.target_ids[..., None])[..., 0] * self.loss_mask

    def rows(self, values: torch.Tensor) -> list[list[float]]:
        """Per-position values [B, T] -> each datum's N_i values, in order."""
        lengths = self.loss_mask.sum(dim=1).long().tolist()
        return [row[:n] for row, n in zip(values.tolist(), lengths)]


@dataclass
class SharedPrefixBatch:
    """Datums whose prefixes run once (see the module docstring). Per-token tensors in the plain layout [B, T]
    (`target_ids`, `loss_mask`, `inputs`); the forward's: `prompt_ids` [P, Lp] left-padded distinct prefixes and
    their `prompt_mask`, `prompt_of` [B] the prefix each datum continues, `prefix` [B] its length, `completion_ids`
    [B, Lr] right-padded the rest of each datum's input and its `completion_mask` (the names `rl.split` reads the
    cost of a row by, as a `rl.prefix_batch.PrefixBatch`'s)."""

    target_ids: torch.Tensor
    loss_mask: torch.Tensor
    inputs: dict[str, torch.Tensor]
    prompt_ids: torch.Tensor
    prompt_mask: torch.Tensor
    prompt_of: torch.Tensor
    prefix: torch.Tensor
    completion_ids: torch.Tensor
    completion_mask: torch.Tensor

    old_logprobs = TargetBatch.old_logprobs
    advantages = TargetBatch.advantages
    rows = TargetBatch.rows

    def select(self, rows: torch.Tensor) -> SharedPrefixBatch:
        """The datums at `rows` ([K] long) and only the prefixes they continue."""
        used, prompt_of = torch.unique(self.prompt_of[rows], return_inverse=True)
        return SharedPrefixBatch(
            self.target_ids[rows], self.loss_mask[rows], {k: v[rows] for k, v in self.inputs.items()},
            self.prompt_ids[used], self.prompt_mask[used], prompt_of, self.prefix[rows], self.completion_ids[rows],
            self.completion_mask[rows],
        )  # fmt: skip

    def to(self, device: torch.device | str) -> SharedPrefixBatch:
        moved = {k: v.to(device) if isinstance(v, torch.Tensor) else v for k, v in self.__dict__.items()}
        moved["inputs"] = {k: v.to(device) for k, v in self.inputs.items()}
        return SharedPrefixBatch(**moved)

    def logprobs(self, model: nn.Module, temperature: float = 1.0) -> torch.Tensor:
        """Each position's logprob of its target -> [B, T] (0 on padding): the prefixes' positions from one pass
        over the P prefixes, the rest from one pass of the B rests against their keys and values."""
        positions = (self.prompt_mask.cumsum(-1) - 1).clamp(min=0)
        out = model(input_ids=self.prompt_ids, attention_mask=self.prompt_mask, position_ids=positions, use_cache=True)
        cache = out.past_key_values
        cache.batch_select_indices(self.prompt_of)  # each row continues its prefix's keys and values
        mask = torch.cat([self.prompt_mask[self.prompt_of], self.completion_mask.long()], dim=1)
        start = self.prompt_mask.sum(-1)[self.prompt_of][:, None]
        width = self.completion_ids.shape[1]
        rest = model(
            input_ids=self.completion_ids,
            attention_mask=mask,
            position_ids=start + torch.arange(width, device=start.device),
            past_key_values=cache,
            use_cache=True,
        )
        prompt_logp, rest_logp = (_log_softmax(x.logits, temperature) for x in (out, rest))
        span = torch.arange(self.target_ids.shape[1], device=start.device)[None, :]  # [1, T]
        in_prefix = span < self.prefix[:, None]
        # position t < prefix of datum b is column Lp - prefix + t of its (left-padded) prefix row; the others are
        # column t - prefix of its rest
        lp = self.prompt_ids.shape[1]
        prompt_col = (lp - self.prefix[:, None] + span).clamp(0, lp - 1)
        rest_col = (span - self.prefix[:, None]).clamp(0, width - 1)
        rows = torch.arange(len(self.prefix), device=start.device)[:, None]
        from_prompt = prompt_logp[self.prompt_of[:, None], prompt_col, self.target_ids]
        from_rest = rest_logp[rows, rest_col, self.target_ids]
        return torch.where(in_prefix, from_prompt, from_rest) * self.loss_mask


def _log_softmax(logits: torch.Tensor, temperature: float) -> torch.Tensor:
    if temperature > 0 and temperature != 1.0:
        logits = logits / temperature
    return torch.log_softmax(logits.to(torch.promote_types(logits.dtype, torch.float32)), -1)  # bf16: in fp32
