"""The agents' backend over a forge_nb engine (`engines.base.Engine`: torch or vLLM), in process.

The generator actor will wrap its engine the same way; the client only needs
``generate(prompt_ids, sampling) -> one Completion per prompt``. When every distinct prompt of a batch
occurs the same number of times k (the first turn of GRPO groups: G copies of each row's prompt), the
engine gets each prompt once with ``n=k``, so it prefills each prompt once instead of k times.
"""

from __future__ import annotations

from dataclasses import replace

from forge_nb.agents.batching import Backend
from forge_nb.engines.base import Completion, SamplingParams


def engine_backend(engine) -> Backend:
    """`engine.generate` as a backend: prompts [B][P_i] token ids -> B completions (n = 1 each)."""

    def generate(prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        distinct: dict[tuple[int, ...], int] = {}
        for ids in prompt_ids:
            distinct[tuple(ids)] = distinct.get(tuple(ids), 0) + 1
        repeats = set(distinct.values())
        if len(repeats) == 1 and (k := repeats.pop()) > 1:
            groups = engine.generate([list(p) for p in distinct], replace(sampling, n=k))
            samples = {p: iter(group) for p, group in zip(distinct, groups)}
            return [next(samples[tuple(ids)]) for ids in prompt_ids]
        groups = engine.generate(prompt_ids, replace(sampling, n=1))
        return [group[0] for group in groups]

    return generate
