"""Trainer actor: owns the trainable policy, takes GRPO steps with the live loss, publishes weights."""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path

import torch
from monarch.actor import endpoint
from transformers import AutoModelForCausalLM

from forge_nb.actors.base import ForgeActor
from forge_nb.actors.model_spec import ModelSpec
from forge_nb.config import AlgorithmConfig, Config, LoraConfig
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.validate import CheckFailed, check_loss_value
from forge_nb.lora import adapter
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.prefix_batch import completion_logprobs
from forge_nb.rl.train_step import NonFiniteGradient, policy_update
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.publish import WeightPublisher

STATE_FILE = "trainer_state.pt"


class LossFailed(RuntimeError):
    """The live loss failed on a training batch; no optimizer step was taken."""


@dataclass(frozen=True)
class TrainerSpec(ModelSpec):
    """The trainable model (`ModelSpec`), its optimisation (`algorithm`, the loss it starts with), and
    how it publishes weights (`serve_dtype`, RDMA chunks of `chunk_mb`). With `lora`, only a LoRA
    adapter on the frozen base trains, and only the adapter is published."""

    algorithm: AlgorithmConfig
    loss: LiveCode
    serve_dtype: str
    chunk_mb: int
    resume_from: str = ""  # a checkpoint's trainer/ folder (`save_state`): weights, optimizer, RNG, versions
    loss_version: int = 0
    lora: LoraConfig | None = None

    @classmethod
    def from_config(cls, config: Config, pad_id: int, loss: LiveCode) -> TrainerSpec:
        return super().from_config(
            config,
            pad_id,
            algorithm=config.algorithm,
            loss=loss,
            serve_dtype=config.serve_dtype,
            chunk_mb=config.weights.chunk_mb,
            lora=config.lora if config.lora.enabled else None,
        )


@dataclass(frozen=True)
class TrainResult:
    """What one `train_step` did: the policy version it published, the loss version it ran, the
    step's metrics (`rl.train_step.policy_update`: loss, grad_norm, approx_kl, tokens, ...) and times (s)."""

    policy_version: int
    loss_version: int
    metrics: dict[str, float]
    train_seconds: float
    publish_seconds: float
    # Per sequence, the policy's logprob of each completion token before the step (the rollout log's
    # "trainer_logprobs", beside the generator's); rows the step left out keep their behaviour logprobs.
    # None when the batch did not ask for them (`TrainBatch.keep_logprobs`: no rollout log).
    token_logprobs: list[list[float]] | None = None

    def as_dict(self) -> dict[str, float]:
        skip = ("metrics", "token_logprobs")
        return {**self.metrics, **{k: v for k, v in self.__dict__.items() if k not in skip}}


class Trainer(ForgeActor):
    """Holds the model and AdamW state (of the trainable parameters: every weight, or the LoRA adapter's).
    Its policy version (optimizer steps taken; 0 = as loaded) is the one its publisher last stamped:
    `version`. With LoRA it is also the reference model: the base with the adapter off."""

    role = "trainer"

    def __init__(self, spec: TrainerSpec) -> None:
        self._begin(spec.threads)
        torch.manual_seed(0)
        self.device = torch.device(spec.device)
        self.lora = spec.lora
        # With LoRA a checkpoint holds the adapter only: the base always comes from the model's directory.
        source = spec.model_dir if self.lora else (spec.resume_from or spec.model_dir)
        model = AutoModelForCausalLM.from_pretrained(source, dtype=getattr(torch, spec.dtype))
        if self.lora:
            model = adapter.wrap(model, self.lora, spec.resume_from)
        self.model = model.to(self.device)
        self.algorithm = spec.algorithm
        trainable = [p for p in self.model.parameters() if p.requires_grad]
        self.optimizer = torch.optim.AdamW(trainable, lr=spec.algorithm.lr, weight_decay=0.0)
        self._use_loss(spec.loss, spec.loss_version)
        self.pad_id, self.temperature = spec.pad_id, spec.temperature
        version = self._load_state(spec.resume_from) if spec.resume_from else 0
        serve_dtype = getattr(torch, spec.serve_dtype)
        self.publisher = WeightPublisher(self._published(), version, serve_dtype, spec.chunk_mb)
        self._ready(device=spec.device, lora=bool(self.lora), **self.sizes())

    def _published(self) -> list[tuple[str, torch.Tensor]]:
        """What a refresh ships: every parameter, or with LoRA the adapter's (peft's saved names)."""
        return adapter.adapter_tensors(self.model) if self.lora else list(self.model.named_parameters())

    def sizes(self) -> dict[str, int]:
        """Trainable and total parameters, the adapter's bytes (0 without LoRA) and the bytes of a
        published snapshot (what one refresh moves, its 64-byte header and alignment included)."""
        counts = adapter.parameter_counts(self.model)
        if not self.lora:
            counts["adapter_bytes"] = 0
        return {**counts, "refresh_bytes": self.publisher.nbytes}

    @property
    def version(self) -> int:
        """The policy version of the weights: the one published last."""
        return self.publisher.version

    @endpoint
    def set_loss(self, code: LiveCode, version: int) -> int:
        """Compile and make loss `version` live for the next batch -> the version now live."""
        self._use_loss(code, version)
        return self.loss_version

    def _use_loss(self, code: LiveCode, version: int) -> None:
        self.loss_fn, self.loss_version, self.loss_inert = compile_function(code), version, code.zero_advantage_inert

    @endpoint
    def train_step(self, batch: TrainBatch) -> TrainResult:
        """One optimizer step on a batch of B sequences, then publish the new weights.

        The policy version goes up by one; the published snapshot holds it when this returns.
        If the live loss fails, `LossFailed` is raised and neither weights nor versions change.
        """
        start = time.perf_counter()
        tokens = batch.collate(self.pad_id).to(self.device)
        try:
            metrics, logprobs = policy_update(
                self.model,
                self.optimizer,
                tokens,
                self.loss_fn,
                self.temperature,
                self.algorithm.max_grad_norm,
                check_loss_value,
                skip_zero_advantage=self.loss_inert,
            )
        except (CheckFailed, NonFiniteGradient) as e:
            raise LossFailed(f"loss v{self.loss_version} {e}; no optimizer step was taken") from None
        except Exception as e:
            raise LossFailed(f"loss v{self.loss_version} raised {type(e).__name__}: {e}; no step was taken") from None
        stepped = time.perf_counter()
        self.publisher.publish(self._published(), self.version + 1)
        end = time.perf_counter()
        token_logprobs = None
        if batch.keep_logprobs:
            token_logprobs = [row[: len(c)] for row, c in zip(logprobs.cpu().tolist(), batch.completion_ids)]
        return TrainResult(self.version, self.loss_version, metrics, end - start, end - stepped, token_logprobs)

    @endpoint
    def weights_manifest(self) -> WeightManifest:
        """Layout and RDMA handle of the published snapshot (stable for the session)."""
        return self.publisher.manifest()

    @endpoint
    def unlink_shared_memory(self) -> None:
        """Drop the /dev/shm names once every generator has mapped them (nothing can leak after)."""
        self.publisher.unlink()

    @endpoint
    def save(self, path: str) -> int:
        """Write the current weights as an HF model directory (config.json + safetensors) -> version.
        With LoRA: the adapter in peft's format at `path` and the merged model at path/merged."""
        if self.lora:
            adapter.save(self.model, path, merged=True)
        else:
            self.model.save_pretrained(path)
        return self.version

    @endpoint
    def save_state(self, path: str) -> int:
        """Write what resuming needs exactly: the weights (HF directory; with LoRA the adapter, in peft's
        format) and, beside them, `trainer_state.pt` with the optimizer state, the RNG state and the
        policy version -> version."""
        self.model.save_pretrained(path)
        state = {"optimizer": self.optimizer.state_dict(), "rng": torch.get_rng_state(), "version": self.version}
        torch.save(state, Path(path) / STATE_FILE)
        return self.version

    def _load_state(self, path: str) -> int:
        state = torch.load(Path(path) / STATE_FILE, map_location=self.device, weights_only=True)
        self.optimizer.load_state_dict(state["optimizer"])
        torch.set_rng_state(state["rng"])
        return state["version"]

    # -- diagnostics: for tests and debugging, never on the training path ----------------------

    @endpoint
    def checksum(self) -> tuple[int, str]:
        """(policy version, checksum of what the trainer publishes: its parameters, or the adapter's)."""
        return self.version, checksum(self._published())

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Recompute the completions' token logprobs under the current weights (no grad)."""
        return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, self.temperature)

    @endpoint
    def reference_logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """LoRA only: the reference model's logprobs, i.e. the base's with the adapter off (no second
        copy of the weights; the `Reference` actor's contract)."""
        with self.model.disable_adapter():
            return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, self.temperature)
