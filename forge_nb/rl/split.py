"""How one step's batch is split: over the ranks of a trainer gang, and into micro-batches on each rank.

Every rank holds the whole batch (token ids are small) and computes the same plan, so no rank has to
ask another what it does: the rows that run through the model are packed into micro-batches of at
most `micro_batch_tokens` padded tokens, dealt out to the ranks in contiguous runs of near-equal cost
(without a budget: one micro-batch per rank, its share of the rows). Every rank runs as many
micro-batches as the busiest one (the others run a one-row micro-batch whose gradient is multiplied
by 0), because a sharded model's forward and backward are collectives that every rank must enter the
same number of times.

Cost is what a micro-batch's tensors hold: a `PrefixBatch` keeps the whole batch's widths when rows
are selected (Lp for prompts, Lc for completions; so every micro-batch makes the same model calls),
so its micro-batch of P prompts and B completions costs P x Lp + B x Lc tokens; a `TokenBatch`'s
costs B x L.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from forge_nb.rl.batch import TokenBatch
from forge_nb.rl.prefix_batch import PrefixBatch


def _no_reduce(values: torch.Tensor) -> None:
    return None


@dataclass(frozen=True)
class Split:
    """This rank (`rank` of `world`), the token budget of one forward (`micro_batch_tokens`, 0: no
    limit), and `sum_across(t)`, which sums a tensor over the ranks in place (nothing for one rank)."""

    rank: int = 0
    world: int = 1
    micro_batch_tokens: int = 0
    sum_across: Callable[[torch.Tensor], None] = field(default=_no_reduce, compare=False)


#: One rank, the whole batch in one forward.
ONE_RANK = Split()


def row_costs(batch: PrefixBatch | TokenBatch) -> tuple[list[int], list[int]]:
    """-> (cost of each row alone, the prompt each row continues) in padded tokens: a prefix row costs
    its completion width plus, once per micro-batch, its prompt's width; a full-sequence row its width."""
    if hasattr(batch, "prompt_of"):  # a `PrefixBatch`, or Tinker datums sharing prefixes (`rl.target_batch`)
        width = batch.completion_ids.shape[1]
        return [width] * len(batch.prompt_of), batch.prompt_of.tolist()
    rows = batch.input_ids.shape[0]
    return [batch.input_ids.shape[1]] * rows, list(range(rows))


def prompt_width(batch: PrefixBatch | TokenBatch) -> int:
    """Padded tokens a micro-batch pays once for each distinct prompt it holds (0 for full sequences)."""
    return batch.prompt_ids.shape[1] if hasattr(batch, "prompt_of") else 0


def partition(rows: list[int], costs: list[int], parts: int) -> list[list[int]]:
    """`rows` (in order) cut into `parts` contiguous runs of near-equal total cost (some may be empty)."""
    total = sum(costs[r] for r in rows)
    out: list[list[int]] = [[] for _ in range(parts)]
    done = 0
    for r in rows:
        # The run this row's middle falls in: run k holds the costs in [k, k + 1) x total / parts.
        k = min(parts - 1, int((done + costs[r] / 2) * parts / total)) if total else 0
        out[k].append(r)
        done += costs[r]
    return out


def micro_batches(
    rows: list[int], costs: list[int], prompts: list[int], prompt_cost: int, budget: int
) -> list[list[int]]:
    """`rows` (in order) packed into runs whose padded cost (`costs` of the rows plus `prompt_cost` for
    each distinct prompt among them) stays within `budget`; a row that alone is over it runs alone.
    `budget` 0: one run."""
    if not budget:
        return [rows] if rows else []
    out: list[list[int]] = []
    current: list[int] = []
    cost = 0
    seen: set[int] = set()
    for r in rows:
        more = costs[r] + (prompt_cost if prompts[r] not in seen else 0)
        if current and cost + more > budget:
            out.append(current)
            current, cost, seen = [], 0, set()
            more = costs[r] + prompt_cost
        current.append(r)
        cost += more
        seen.add(prompts[r])
    if current:
        out.append(current)
    return out


@dataclass(frozen=True)
class Plan:
    """What this rank runs: its micro-batches (row indices into the batch) and how many it must run
    in all (`count`: the most any rank runs; the rest are zero-gradient fillers)."""

    micro_batches: list[torch.Tensor]
    count: int


def plan(batch: PrefixBatch | TokenBatch, ran: torch.Tensor, split: Split) -> Plan:
    """The micro-batches of `split.rank` for the rows where `ran` ([B] bool) is set, and the count every
    rank runs (the same on every rank: each computes every rank's plan).

    Without a budget each rank's share is one micro-batch. With one, the rows are packed into
    micro-batches first, for the whole batch, and those are dealt out to the ranks in contiguous runs
    of near-equal cost: N ranks then run exactly the forwards one rank would run with the same budget
    (the same rows together, so the same rounding), only spread out."""
    costs, prompts = row_costs(batch)
    rows = ran.nonzero()[:, 0].tolist()
    if not split.micro_batch_tokens:
        per_rank = [[part] if part else [] for part in partition(rows, costs, split.world)]
    else:
        packed = micro_batches(rows, costs, prompts, prompt_width(batch), split.micro_batch_tokens)
        sizes = [sum(costs[r] for r in mb) + prompt_width(batch) * len({prompts[r] for r in mb}) for mb in packed]
        per_rank = [[packed[i] for i in run] for run in partition(list(range(len(packed))), sizes, split.world)]
    mine = [torch.tensor(mb, dtype=torch.long) for mb in per_rank[split.rank]]
    return Plan(mine, max(1, max(len(p) for p in per_rank)))


def completion_values(values: torch.Tensor, completion_mask: torch.Tensor) -> list[list[float]]:
    """Per-token values of a batch ([B, T], either layout) -> each row's values on its completion tokens,
    in order (the positions where `completion_mask` is 1)."""
    lengths = completion_mask.sum(dim=1).long().tolist()
    flat = values[completion_mask.bool()].tolist()
    out, start = [], 0
    for n in lengths:
        out.append(flat[start : start + n])
        start += n
    return out
