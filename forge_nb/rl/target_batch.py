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
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from torch import nn


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

    def collate(self, pad_id: int) -> TargetBatch:
        """Right-padded tensors of the datums (`pad_id` on padding, which the attention mask hides)."""
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
        return TargetBatch(input_ids, real.long(), target_ids, real.float(), inputs)


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
