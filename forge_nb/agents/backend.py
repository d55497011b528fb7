"""The agents' backends: a forge_nb engine in process (`engine_backend`), or the generator actors
(`generator_backend`, what the env procs use). The client only needs
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
        prompts, sampling, spread = grouped(prompt_ids, sampling)
        return spread(engine.generate(prompts, sampling))

    return generate


class GeneratorBackend:
    """The generator actors as an async backend: each batch of model calls is one `generate` call on the
    replicas (prompts split over them, as the session's rollouts are). `versions`: every policy version
    that answered, so a trajectory knows which weights made it."""

    def __init__(self, generator, replicas: int = 1) -> None:
        self.generator, self.replicas = generator, replicas
        self.versions: list[int] = []

    async def __call__(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        prompts, sampling, spread = grouped(prompt_ids, sampling)
        if sampling.seed is not None:  # each turn draws fresh randomness, still seeded
            sampling = replace(sampling, seed=sampling.seed + 7919 * len(self.versions))
        size = -(-len(prompts) // self.replicas)
        parts = [prompts[i : i + size] for i in range(0, len(prompts), size)]
        groups = []
        for i, part in enumerate(parts):
            replica = self.generator.slice(procs=i) if self.replicas > 1 else self.generator
            generation = await replica.generate.call_one(part, sampling)
            self.versions.append(generation.policy_version)
            groups += generation.completions
        return spread(groups)


def generator_backend(generator, replicas: int = 1) -> GeneratorBackend:
    """The generator actor mesh `generator` (its `generate` endpoint) as a backend."""
    return GeneratorBackend(generator, replicas)


def grouped(prompt_ids: list[list[int]], sampling: SamplingParams):
    """When every distinct prompt occurs k > 1 times, each once with n = k -> (prompts, sampling, a
    function from the engine's groups back to one completion per original prompt)."""
    distinct: dict[tuple[int, ...], int] = {}
    for ids in prompt_ids:
        distinct[tuple(ids)] = distinct.get(tuple(ids), 0) + 1
    repeats = set(distinct.values())
    if len(repeats) == 1 and (k := repeats.pop()) > 1:

        def spread(groups: list[list[Completion]]) -> list[Completion]:
            samples = {p: iter(group) for p, group in zip(distinct, groups)}
            return [next(samples[tuple(ids)]) for ids in prompt_ids]

        return [list(p) for p in distinct], replace(sampling, n=k), spread
    return prompt_ids, replace(sampling, n=1), lambda groups: [group[0] for group in groups]
