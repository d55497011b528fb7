"""Trainer side of LoRA: wrap the policy with a peft adapter, name its tensors as peft saves them,
save and load it.

Published and saved names are peft's file names (`get_peft_model_state_dict`): the parameter name
without the adapter's name, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``
(A: [r, in_features], B: [out_features, r]). A generator maps them back to the base weight
``model.layers.0.self_attn.q_proj.weight`` (`serve.base_weight_name`).
"""

from __future__ import annotations

from pathlib import Path

import torch

from forge_nb.config.lora import LoraConfig
from forge_nb.lora.targets import peft_config

ADAPTER = "default"  # peft's name for the one adapter a model gets


def wrap(model: torch.nn.Module, lora: LoraConfig, adapter_dir: str = "") -> torch.nn.Module:
    """`model` with a fresh adapter (B = 0: the model's outputs are unchanged), or the one saved in
    `adapter_dir` (`save`), trainable; every base weight frozen."""
    import peft

    if adapter_dir:
        return peft.PeftModel.from_pretrained(model, adapter_dir, is_trainable=True)
    return peft.get_peft_model(model, peft_config(lora))


def adapter_tensors(model: torch.nn.Module) -> list[tuple[str, torch.Tensor]]:
    """The adapter's trainable tensors under peft's saved names (views of the parameters, no copies)."""
    tag = f".{ADAPTER}."
    return [(n.replace(tag, "."), p) for n, p in model.named_parameters() if p.requires_grad]


def parameter_counts(model: torch.nn.Module) -> dict[str, int]:
    """{"trainable_params", "total_params", "adapter_bytes"}: what `status()` and the dashboard show."""
    trainable = [p for p in model.parameters() if p.requires_grad]
    return {
        "trainable_params": sum(p.numel() for p in trainable),
        "total_params": sum(p.numel() for p in model.parameters()),
        "adapter_bytes": sum(p.numel() * p.element_size() for p in trainable),
    }


def save(model: torch.nn.Module, path: str | Path, merged: bool = False) -> None:
    """The adapter in peft's format at `path` (adapter_config.json + adapter_model.safetensors:
    `peft.PeftModel.from_pretrained(base, path)` loads it); with `merged`, also the base with the
    adapter merged in, as a plain HF model directory at path/merged."""
    model.save_pretrained(str(path))
    if merged:
        merged_model = _merged_copy(model)
        merged_model.save_pretrained(str(Path(path) / "merged"))


@torch.no_grad()
def _merged_copy(model: torch.nn.Module) -> torch.nn.Module:
    """A plain model holding base + scale * B @ A in every target (the trainer's model is left unmerged:
    merging in place and back would round the base weights)."""
    import copy

    return copy.deepcopy(model).merge_and_unload()
