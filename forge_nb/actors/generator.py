"""Generator actor: serves the policy with an engine and refreshes it from published weights."""

from __future__ import annotations

import os
import time

import torch
from monarch.actor import Actor, endpoint

from forge_nb.actors import setup_proc
from forge_nb.engines import load_engine
from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.refresh import WeightReceiver


class Generator(Actor):
    """Holds one engine over `model_dir`. Serves policy version 0 until the first refresh.

    Every endpoint is async (Monarch forbids mixing) and runs on the actor's one event loop.
    `generate` never awaits, and a refresh loads the copied weights and bumps the version without
    awaiting either, so weights and version change together and only between batches.
    """

    def __init__(
        self, model_dir: str, dtype: str, threads: int, engine: str = "torch", engine_options: dict | None = None
    ) -> None:
        setup_proc(threads)
        start = time.perf_counter()
        self.engine = load_engine(engine, model_dir, getattr(torch, dtype), **(engine_options or {}))
        self.engine_name, self.start_s = engine, time.perf_counter() - start
        self.receiver: WeightReceiver | None = None
        self.version = 0

    @endpoint
    async def generate(self, prompts: list[str], sampling: SamplingParams) -> tuple[list[list[Completion]], int, float]:
        """-> (completions[prompt][sample], policy version that produced them, seconds)."""
        start = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        return completions, self.version, time.perf_counter() - start

    @endpoint
    async def score(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> tuple[list[list[float]], int]:
        """-> (teacher-forced logprobs at temperature 1 from the served weights, policy version)."""
        return self.engine.score(prompt_ids, completion_ids), self.version

    @endpoint
    async def attach(self, manifest: WeightManifest, transport: str) -> str:
        """Remember where the trainer publishes (once per session; refreshes then move only bytes)
        -> the transport chosen ("shm" on the trainer's host, else "rdma")."""
        self.receiver = WeightReceiver(manifest, version=self.version, transport=transport)
        return self.receiver.transport

    @endpoint
    async def refresh(self, version: int) -> dict:
        """Load published `version` (batch boundary: never runs while `generate` does) -> report."""
        report = await self.receiver.refresh(version, self.engine.load_weights)
        self.version = report.version
        return report.as_dict()

    @endpoint
    async def checksum(self) -> tuple[int, str]:
        return self.version, checksum(self.engine.named_weights())

    @endpoint
    async def pid(self) -> int:
        return os.getpid()

    @endpoint
    async def engine_info(self) -> dict:
        """-> {"engine": name, "start_s": seconds the engine took to start (warm-up included)}."""
        return {"engine": self.engine_name, "start_s": self.start_s}
