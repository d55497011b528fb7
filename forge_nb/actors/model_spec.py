"""What the actors that hold a torch copy of the policy model (trainer, reference) are started with."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Self

from forge_nb.config import Config


@dataclass(frozen=True)
class ModelSpec:
    """The model `model_dir` in `dtype` on `device` ("auto", "cpu" or "cuda": resolved in the proc, which
    sees only the GPUs its placement gave it), run with `threads` torch threads; its logprobs are those
    of ``logits / temperature`` (the sampling temperature), over batches padded with `pad_id`."""

    model_dir: str
    dtype: str
    threads: int
    device: str
    pad_id: int
    temperature: float

    @classmethod
    def from_config(cls, config: Config, pad_id: int, **more: Any) -> Self:
        """`config`'s model (its resolved path and device) -> a spec of `cls`; `more` are the fields a
        subclass adds."""
        return cls(
            str(config.model.resolved_path()),
            config.model.dtype,
            config.mesh.threads_per_proc,
            config.model.device,
            pad_id,
            config.engine.temperature,
            **more,
        )
