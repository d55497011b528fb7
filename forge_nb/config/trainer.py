"""The `trainer` section: how the trainer computes a step (its procs are `mesh.trainer_procs`).

None of these change what a step computes: micro-batches accumulate the gradient of the whole batch's
loss (`forge_nb.rl.split`), and a gang of N procs sums its ranks' parts of that gradient. They change
where it runs and how much memory it takes.
"""

from __future__ import annotations

from dataclasses import dataclass

from forge_nb.config.sections import ConfigError


@dataclass
class TrainerConfig:
    """Micro-batches of at most `micro_batch_tokens` padded tokens per forward (0: the rank's whole
    share of the batch in one forward); `activation_checkpointing` recomputes each decoder block's
    activations in the backward instead of keeping them (and trains full sequences: see
    `forge_nb.rl.split`); `mixed_precision` "bf16": FSDP2 computes in bfloat16 on float32 master
    weights and reduces gradients in float32; `cpu_offload`: parameters, gradients and optimizer state
    live in host memory between uses (FSDP2's CPUOffloadPolicy; GPU only). A collective that waits
    longer than `collective_timeout_s` (a rank died or hangs) fails the step and restarts the gang."""

    micro_batch_tokens: int = 0
    activation_checkpointing: bool = False
    mixed_precision: str = "none"  # "none" or "bf16"
    cpu_offload: bool = False
    collective_timeout_s: float = 600.0
    entropy: bool = True  # the policy-entropy metric: one more pass over each token's vocabulary (rl/entropy.py);
    # computed anyway for a loss that takes `entropies` (algorithm.top_entropy_quantile)

    def validate(self) -> None:
        if self.micro_batch_tokens < 0:
            raise ConfigError(f"trainer.micro_batch_tokens must be >= 0 (0: no limit), got {self.micro_batch_tokens}")
        if self.mixed_precision not in ("none", "bf16"):
            raise ConfigError(f"trainer.mixed_precision must be one of ['none', 'bf16'], got {self.mixed_precision!r}")
        if not self.collective_timeout_s > 0:
            raise ConfigError(f"trainer.collective_timeout_s must be > 0, got {self.collective_timeout_s}")

    def sharded(self, procs: int) -> bool:
        """Whether the trainer wraps the policy with FSDP2: several procs, or an FSDP2-only option."""
        return procs > 1 or self.mixed_precision != "none" or self.cpu_offload


def check_devices(config) -> None:
    """Checks across sections (`Config.validate`): a GPU asked for where there is none, options that need
    one, and a generator replica asked to span several GPUs. `config` is a `forge_nb.config.Config`."""
    model, mesh, trainer = config.model, config.mesh, config.trainer
    gpus_somewhere = _gpus_somewhere(config)
    if model.device == "cuda" and not gpus_somewhere:
        where = {
            "slurm": "slurm.gpus_per_node is 0",
            "hosts": "mesh.gpus_per_host is not set and this machine has none",
        }.get(mesh.kind, "torch here has no CUDA device (torch.cuda.is_available() is False)")
        raise ConfigError(f"model.device='cuda' but {where}; use model.device='auto' or 'cpu'")
    if trainer.cpu_offload and (model.device == "cpu" or not gpus_somewhere):
        raise ConfigError(
            "trainer.cpu_offload keeps the trainer's state in host memory between uses on a GPU; "
            "the trainer runs on the CPU here (its state is in host memory already)"
        )
    if trainer.mixed_precision != "none" and model.dtype != "float32":
        raise ConfigError(
            f"trainer.mixed_precision={trainer.mixed_precision!r} computes in bfloat16 from float32 master "
            f"weights: model.dtype must be 'float32', got {model.dtype!r}"
        )
    if config.engine.tensor_parallel_size > 1 and config.engine_name() != "vllm":
        raise ConfigError(
            f"engine.tensor_parallel_size={config.engine.tensor_parallel_size} splits a replica over vLLM's ranks; "
            f"the {config.engine_name()} engine serves a replica in one process: set engine.name='vllm', or keep "
            "tensor_parallel_size=1 and add replicas (mesh.generator_procs)"
        )


def _gpus_somewhere(config) -> bool:
    """Whether the hosts this config runs on have GPUs, as far as the kernel can tell."""
    if config.mesh.kind == "slurm":
        return config.slurm.gpus_per_node > 0
    if config.mesh.gpus_per_host >= 0:
        return config.mesh.gpus_per_host > 0
    import torch

    return torch.cuda.is_available()
