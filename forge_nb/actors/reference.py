"""Reference actor: the policy's initial weights, frozen, scoring completions for the KL penalty."""

from __future__ import annotations

import os

import torch
from monarch.actor import Actor, endpoint
from transformers import AutoModelForCausalLM

from forge_nb.actors import setup_proc
from forge_nb.rl.batch import completion_logprobs


class Reference(Actor):
    """Loads `model_dir` once and never changes it (started when ``algorithm.kl_coef > 0``)."""

    def __init__(
        self, model_dir: str, dtype: str, threads: int, pad_id: int, temperature: float, device: str = "cpu"
    ) -> None:
        setup_proc(threads)
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype))
        self.model = model.to(torch.device(device)).eval()
        self.model.requires_grad_(False)
        self.pad_id, self.temperature = pad_id, temperature

    @endpoint
    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Reference logprobs of each completion's tokens (``logits / temperature``, as the trainer's)."""
        return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, self.temperature)

    @endpoint
    def pid(self) -> int:
        return os.getpid()
