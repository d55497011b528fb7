"""A generator whose engine can lose "a rank" after loading the first tensor of a refresh, for
tests/actors/test_generator.py (spawned into a real proc, which imports this module)."""

from __future__ import annotations

from monarch.actor import endpoint

from forge_nb.actors.generator import Generator, GeneratorSpec


class TearingGenerator(Generator):
    """After `tear_next_load()`, the next refresh's load fails part way, as vLLM's does when a rank dies."""

    def __init__(self, spec: GeneratorSpec) -> None:
        super().__init__(spec)
        self.tear = False
        whole_load = self.engine.load_weights

        def load(named):
            if not self.tear:
                return whole_load(named)
            self.tear = False
            whole_load([next(iter(named))])
            raise RuntimeError("vLLM rank 1 is gone")

        self.engine.load_weights = load

    @endpoint
    async def tear_next_load(self) -> None:
        self.tear = True
