"""Generator actor: serves the policy with an engine and refreshes it from published weights."""

from __future__ import annotations

import os
import time

import torch
from monarch.actor import Actor, endpoint

from forge_nb.actors import setup_proc
from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.refresh import WeightReceiver


class Generator(Actor):
    """Holds one engine over `model_dir`. Serves policy version 0 until the first refresh.

    Every endpoint is async (Monarch forbids mixing) and runs on the actor's one event loop.
    `generate` never awaits, and a refresh loads the copied weights and bumps the version without
    awaiting either, so weights and version change together and only between batches.
    """

    def __init__(self, model_dir: str, dtype: str, threads: int) -> None:
        setup_proc(threads)
        self.engine = TorchEngine.load(model_dir, getattr(torch, dtype))
        self.receiver: WeightReceiver | None = None
        self.version = 0

    @endpoint
    async def generate(self, prompts: list[str], sampling: SamplingParams) -> tuple[list[list[Completion]], int, float]:
        """-> (completions[prompt][sample], policy version that produced them, seconds)."""
        start = time.perf_counter()
        completions = self.engine.generate(prompts, sampling)
        return completions, self.version, time.perf_counter() - start

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
