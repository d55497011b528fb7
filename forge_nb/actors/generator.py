"""Generator actor: serves the policy with an engine and refreshes it from published weights."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from monarch.actor import endpoint
from safetensors.torch import save_file

from forge_nb.actors.base import AsyncForgeActor
from forge_nb.config import Config, LoraConfig
from forge_nb.engines import load_engine
from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.lora.serve import ServedAdapter, read_adapter, served_adapter
from forge_nb.runtime import last_words
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.refresh import RefreshReport, TornWeights, WeightReceiver
from forge_nb.weights.shards import whole_shapes
from forge_nb.wire import Packed


@dataclass(frozen=True)
class GeneratorSpec:
    """What a generator serves: `model_dir` in `dtype` with engine `engine` ("torch" or "vllm"); with
    `lora`, the base model plus a LoRA adapter that refreshes replace (`forge_nb.lora.serve`), the one
    saved in `adapter_dir` to start with (a checkpoint's)."""

    model_dir: str
    dtype: str
    threads: int
    engine: str = "torch"
    engine_options: dict = field(default_factory=dict)  # vLLM's: max_model_len, seed, kv_cache_mb, ...
    version: int = 0  # the policy version `model_dir` holds (a checkpoint's, when resuming)
    lora: LoraConfig | None = None
    adapter_dir: str = ""
    device: str = "cpu"  # the torch engine's: model.device as the placement plan gives it (`Placement.device`)

    @classmethod
    def from_config(cls, config: Config, engine: str) -> GeneratorSpec:
        e, options = config.engine, {}
        if engine == "vllm":
            options = {
                "max_model_len": e.max_model_len or None,
                "seed": config.seed,
                "kv_cache_mb": e.kv_cache_mb,
                "gpu_memory_utilization": e.gpu_memory_utilization,
                "tensor_parallel_size": e.tensor_parallel_size,
            }
        lora = config.lora if config.lora.enabled else None
        if engine == "vllm" and lora is not None:
            options["max_lora_rank"] = lora.r
        model_dir = str(config.model.resolved_path())
        threads = config.mesh.threads_per_proc
        return cls(model_dir, config.serve_dtype, threads, engine, options, lora=lora)


@dataclass(frozen=True)
class Generation(Packed):
    """`completions[prompt][sample]`, the policy version that produced them, and seconds taken."""

    completions: list[list[Completion]]
    policy_version: int
    seconds: float


class Generator(AsyncForgeActor):
    """Holds one engine. Serves policy version 0 until the first refresh.

    Every endpoint is async (Monarch forbids mixing) and runs on the actor's one event loop.
    `generate` never awaits, and a refresh loads the copied weights and bumps the version without
    awaiting either, so weights and version change together and only between batches.
    """

    role = "generator"

    def __init__(self, spec: GeneratorSpec) -> None:
        self._begin(spec.threads)
        dtype = getattr(torch, spec.dtype)
        self.engine = load_engine(spec.engine, spec.model_dir, dtype, spec.device, **spec.engine_options)
        self.receiver: WeightReceiver | None = None
        self.adapter: ServedAdapter | None = None
        if spec.lora is not None:
            self.adapter = served_adapter(self.engine, spec.engine, spec.lora)
            if spec.adapter_dir:
                self.adapter.load(read_adapter(spec.adapter_dir).items(), spec.version)
        self._loaded_version = spec.version  # what `model_dir` holds, until a receiver is attached
        self._ready(engine=spec.engine, device=str(self.engine.device))

    @property
    def version(self) -> int:
        """The policy version served: the receiver's, once attached (it loads every refresh)."""
        return self.receiver.version if self.receiver is not None else self._loaded_version

    @contextlib.contextmanager
    def _serving(self) -> Iterator[None]:
        """Around each use of the engine: an engine lost for good (vLLM over several ranks, one of whose
        worker processes died) ends this proc, before the call or when the call fails, so that Monarch reports
        it dead and the session starts the generator afresh, as it does a killed one (`fleet.recovery`)."""
        self._end_if_lost()
        try:
            yield
        except Exception:
            self._end_if_lost()
            raise

    def _end_if_lost(self) -> None:
        lost = getattr(self.engine, "lost", None)
        why = lost() if lost is not None else None
        if why:
            said = f"generator (pid {os.getpid()}): {why}"
            print(f"forge_nb {said}: ending this proc to be started afresh", file=sys.stderr)
            sys.stderr.flush()
            last_words.say(said)  # for the session's report of this proc's end
            os._exit(1)

    def _whole(self) -> None:
        """Refuse to serve weights that a failed load left a mix of two versions (`WeightReceiver.torn`)."""
        if self.receiver is not None and self.receiver.torn is not None:
            raise self._torn()

    def _torn(self) -> TornWeights:
        return TornWeights(
            f"generator (pid {os.getpid()}): {self.receiver.torn}; it samples nothing until a refresh loads a "
            "whole version (the session replaces it, as a dead one, and calls again)"
        )

    @endpoint
    async def generate(self, prompts: list[str], sampling: SamplingParams) -> Generation:
        self._whole()
        start = time.perf_counter()
        with self._serving():
            completions = self.engine.generate(prompts, sampling)
        return Generation(completions, self.version, time.perf_counter() - start)

    @endpoint
    async def attach(self, manifests: list[WeightManifest], transport: str, member: int = 0) -> str:
        """Remember where the trainer publishes: its one snapshot, or every rank's shards (once per
        session; refreshes then move only bytes) -> the transport chosen ("cuda_ipc" between GPUs of the
        trainer's host, "shm" on its host, "tcp" elsewhere, or "rdma"; "shm+tcp" when ranks differ). With
        "group" this replica joins every trainer rank's broadcast group as `member` (replica i: i + 1)."""
        self._check_fit(manifests)  # a misfit is refused here, not half way through a refresh
        version = self.version  # what the engine serves now, kept by the new receiver
        torn = self.receiver.torn if self.receiver is not None else None  # and a torn load stays torn
        make = lambda: WeightReceiver(manifests, version, transport, self.engine.device, member)  # noqa: E731
        # The old receiver stays until the new one stands (a failed attach leaves this replica as it was).
        receiver = await asyncio.to_thread(make) if transport == "group" else make()
        receiver.torn, self.receiver = torn, receiver
        return receiver.transport

    @endpoint
    async def fits(self, manifests: list[WeightManifest]) -> None:
        """`WeightsRefused` unless the trainer's published tensors fit the served model (the engine's own check,
        where it has one): asked before a weights group forms, whose members would otherwise wait for this
        replica until `weights.group_timeout_s`."""
        self._check_fit(manifests)

    def _check_fit(self, manifests: list[WeightManifest]) -> None:
        check = getattr(self.engine, "check_weights", None)
        if check is not None and self.adapter is None:  # (with LoRA the published tensors are the adapter's)
            check(whole_shapes(manifests))

    @endpoint
    async def served(self) -> int:
        """The policy version served now (a torn replica's: the one it served whole last)."""
        return self.version

    @endpoint
    async def needs(self, version: int) -> bool:
        """Whether a refresh to `version` would load anything (`WeightReceiver.needs`)."""
        return self.receiver is None or self.receiver.needs(version)

    @endpoint
    async def save_weights(self, path: str) -> int:
        """Write the weights served now as `path`/model.safetensors (HF names: the torch engine only;
        vLLM keeps its own fused layout), or with LoRA the adapter served -> their policy version."""
        self._whole()
        if self.adapter is not None:
            self.adapter.save(path)
            return self.version
        Path(path).mkdir(parents=True, exist_ok=True)
        with self._serving():
            tensors = {name: t.contiguous() for name, t in self.engine.named_weights()}
        save_file(tensors, str(Path(path) / "model.safetensors"), metadata={"format": "pt"})
        return self.version

    @endpoint
    async def refresh(self, version: int) -> RefreshReport:
        """Load published `version` (batch boundary: never runs while `generate` does); with LoRA the
        published tensors are the adapter's."""
        if self.adapter is None:
            load = self.engine.load_weights
        else:
            load = lambda named: self.adapter.load(named, version)  # noqa: E731
        try:
            with self._serving():  # (a rank lost mid-load ends this proc: the session starts it afresh)
                return await self.receiver.refresh(version, load)
        except TornWeights as e:
            raise self._torn() from e.__cause__

    # -- diagnostics: for tests and debugging, never on the training path ----------------------

    @endpoint
    async def checksum(self) -> tuple[int, str]:
        """(policy version, checksum of the served weights in the engine's own layout; with LoRA, of the
        adapter served, comparable with the trainer's)."""
        self._whole()  # a torn replica's weights are no version
        if self.adapter is not None:
            return self.version, checksum(self.adapter.tensors.items())
        with self._serving():
            return self.version, checksum(self.engine.named_weights())

    @endpoint
    async def logprobs(
        self, prompt_ids: list[list[int]], completion_ids: list[list[int]]
    ) -> tuple[list[list[float]], int]:
        """-> (teacher-forced logprobs at temperature 1 from the served weights, policy version)."""
        self._whole()
        with self._serving():
            return self.engine.logprobs(prompt_ids, completion_ids), self.version
