"""The agents' backend over a forge_nb engine (`engines.base.Engine`: torch or vLLM), in process.

The generator actor will wrap its engine the same way; the client only needs
``generate(prompt_ids, sampling) -> one Completion per prompt``.
"""

from __future__ import annotations

from dataclasses import replace

from forge_nb.agents.batching import Backend
from forge_nb.engines.base import Completion, SamplingParams


def engine_backend(engine) -> Backend:
    """`engine.generate` as a backend: prompts [B][P_i] token ids -> B completions (n = 1 each)."""

    def generate(prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        groups = engine.generate(prompt_ids, replace(sampling, n=1))
        return [group[0] for group in groups]

    return generate
