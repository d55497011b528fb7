"""Trainer actor: owns the trainable policy, takes GRPO steps with the live loss, publishes weights."""

from __future__ import annotations

import os
import time

import torch
from monarch.actor import Actor, endpoint
from transformers import AutoModelForCausalLM

from forge_nb.actors import setup_proc
from forge_nb.config import AlgorithmConfig
from forge_nb.live.capture import LiveCode, compile_function
from forge_nb.live.validate import CheckFailed, check_loss_value
from forge_nb.rl.batch import collate, completion_logprobs
from forge_nb.rl.train_step import NonFiniteGradient, policy_step
from forge_nb.weights.manifest import WeightManifest, checksum
from forge_nb.weights.publish import WeightPublisher


class LossFailed(RuntimeError):
    """The live loss failed on a training batch; no optimizer step was taken."""


class Trainer(Actor):
    """Holds the model and AdamW state. `version` counts optimizer steps taken (0 = as loaded)."""

    def __init__(
        self,
        model_dir: str,
        dtype: str,
        threads: int,
        algorithm: AlgorithmConfig,
        pad_id: int,
        temperature: float,
        loss: LiveCode,
        serve_dtype: str,
        chunk_mb: int,
        device: str = "cpu",
    ) -> None:
        setup_proc(threads)
        torch.manual_seed(0)
        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype)).to(self.device)
        self.algorithm = algorithm
        self.optimizer = torch.optim.AdamW(self.model.parameters(), lr=algorithm.lr, weight_decay=0.0)
        self._use_loss(loss, 0)
        self.pad_id, self.temperature = pad_id, temperature
        self.version = 0
        self.publisher = WeightPublisher(
            self.model.named_parameters(), self.version, getattr(torch, serve_dtype), chunk_mb
        )

    @endpoint
    def set_loss(self, code: LiveCode, version: int) -> int:
        """Compile and make loss `version` live for the next batch -> the version now live."""
        self._use_loss(code, version)
        return self.loss_version

    def _use_loss(self, code: LiveCode, version: int) -> None:
        self.loss_fn, self.loss_version, self.loss_inert = compile_function(code), version, code.zero_advantage_inert

    @endpoint
    def train_step(
        self,
        prompt_ids: list[list[int]],
        completion_ids: list[list[int]],
        logprobs: list[list[float]],
        advantages: list[float],
        ref_logprobs: list[list[float]] | None = None,
    ) -> dict[str, float]:
        """One optimizer step on a batch of B sequences, then publish the new weights -> metrics.

        The policy version goes up by one; the published snapshot holds it when this returns.
        If the live loss fails, `LossFailed` is raised and neither weights nor versions change.
        """
        start = time.perf_counter()
        batch = collate(prompt_ids, completion_ids, self.pad_id, logprobs, advantages, ref_logprobs).to(self.device)
        try:
            metrics = policy_step(
                self.model, self.optimizer, batch, self.loss_fn, self.temperature,
                self.algorithm.max_grad_norm, check_loss_value, skip_zero_advantage=self.loss_inert,
            )  # fmt: skip
        except (CheckFailed, NonFiniteGradient) as e:
            raise LossFailed(f"loss v{self.loss_version} {e}; no optimizer step was taken") from None
        except Exception as e:
            raise LossFailed(f"loss v{self.loss_version} raised {type(e).__name__}: {e}; no step was taken") from None
        self.version += 1
        stepped = time.perf_counter()
        self.publisher.publish(self.model.named_parameters(), self.version)
        end = time.perf_counter()
        times = {"train_seconds": end - start, "publish_seconds": end - stepped}
        return {**metrics, "policy_version": self.version, "loss_version": self.loss_version, **times}

    @endpoint
    def weights_manifest(self) -> WeightManifest:
        """Layout and RDMA handle of the published snapshot (stable for the session)."""
        return self.publisher.manifest()

    @endpoint
    def unlink_shared_memory(self) -> None:
        """Drop the /dev/shm names once every generator has mapped them (nothing can leak after)."""
        self.publisher.unlink()

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Recompute the completions' token logprobs under the current weights (no grad)."""
        return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, self.temperature)

    @endpoint
    def save(self, path: str) -> int:
        """Write the current weights as an HF model directory (config.json + safetensors) -> version."""
        self.model.save_pretrained(path)
        return self.version

    @endpoint
    def checksum(self) -> tuple[int, str]:
        return self.version, checksum(self.model.named_parameters())

    @endpoint
    def pid(self) -> int:
        return os.getpid()
