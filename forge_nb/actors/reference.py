"""Reference actor: the policy's initial weights, frozen, scoring completions for the KL penalty."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from monarch.actor import endpoint
from transformers import AutoModelForCausalLM

from forge_nb.actors.base import ForgeActor
from forge_nb.actors.model_spec import ModelSpec
from forge_nb.rl.prefix_batch import completion_logprobs


@dataclass(frozen=True)
class ReferenceSpec(ModelSpec):
    """The frozen model: the policy's as `ModelSpec.from_config` reads it from the config, nothing more."""


class Reference(ForgeActor):
    """Loads the model once and never changes it (started when ``algorithm.kl_coef > 0``)."""

    role = "reference"

    def __init__(self, spec: ReferenceSpec) -> None:
        self._begin(spec.threads)
        model = AutoModelForCausalLM.from_pretrained(spec.model_dir, dtype=getattr(torch, spec.dtype))
        self.model = model.to(torch.device(spec.device)).eval()
        self.model.requires_grad_(False)
        self.pad_id, self.temperature = spec.pad_id, spec.temperature
        self._ready()

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Reference logprobs of each completion's tokens (``logits / temperature``, as the trainer's)."""
        return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, self.temperature)
