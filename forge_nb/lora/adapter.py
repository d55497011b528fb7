"""Trainer side of LoRA: wrap the policy with a peft adapter, name its tensors as peft saves them,
save and load it.

Published and saved names are peft's file names (`get_peft_model_state_dict`): the parameter name
without the adapter's name, e.g. ``base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight``
(A: [r, in_features], B: [out_features, r]). A generator maps them back to the base weight
``model.layers.0.self_attn.q_proj.weight`` (`serve.base_weight_name`).
"""

from __future__ import annotations

import dataclasses
import functools
import math
import zlib
from pathlib import Path

import torch

from forge_nb.config.lora import LoraConfig
from forge_nb.lora.targets import peft_config
from forge_nb.parallel import fsdp, sharded_save
from forge_nb.parallel.gang import Gang

ADAPTER = "default"  # peft's name for the one adapter a model gets


def wrap(model: torch.nn.Module, lora: LoraConfig, adapter_dir: str = "") -> torch.nn.Module:
    """`model` with a fresh adapter (B = 0: the model's outputs are unchanged), or the one saved in
    `adapter_dir` (`save`), trainable; every base weight frozen. The adapter is made on the CPU, in the dtype
    peft gives it (the base's; float32 for a 16-bit base), even when the base weights are still on the meta
    device (a sharded trainer fills them later: `parallel.sharded_load`). A fresh A has peft's default
    distribution (kaiming-uniform with a = sqrt(5): uniform in +-1/sqrt(in_features)), drawn in that dtype
    from a generator seeded with the parameter's name: the same at any number of ranks, on either path,
    whatever ran before."""
    import peft
    from peft.utils import load_peft_weights

    saved = None
    config = peft_config(lora)
    if adapter_dir:
        config = peft.PeftConfig.from_pretrained(adapter_dir)
        config.inference_mode = False  # trainable, as from_pretrained(is_trainable=True) makes it
        saved = load_peft_weights(adapter_dir, device="cpu")
    wrapped = peft.get_peft_model(model, config, low_cpu_mem_usage=True)  # the adapter on the meta device
    _adapter_values(wrapped, saved, adapter_dir)
    return wrapped


@torch.no_grad()
def _adapter_values(model: torch.nn.Module, saved: dict[str, torch.Tensor] | None, adapter_dir: str) -> None:
    """Give every adapter parameter (on the meta device) its values: the `saved` ones (peft's file names),
    or fresh ones (A drawn, B = 0)."""
    for name, param in list(model.named_parameters()):
        if not param.is_meta or not param.requires_grad:
            continue
        if not name.endswith((f".lora_A.{ADAPTER}.weight", f".lora_B.{ADAPTER}.weight")):
            raise ValueError(f"the adapter has a parameter forge_nb cannot initialise: {name}")
        owner, _, leaf = name.rpartition(".")
        base = model.get_submodule(owner.split(".lora_")[0]).get_base_layer().weight
        dtype = torch.float32 if base.dtype in (torch.float16, torch.bfloat16) else base.dtype
        if saved is not None:
            key = name.replace(f".{ADAPTER}.", ".")
            if key not in saved or tuple(saved[key].shape) != tuple(param.shape):
                raise ValueError(f"{adapter_dir}: the saved adapter has no {key} of shape {tuple(param.shape)}")
            value = saved[key].to(dtype)
        else:
            value = torch.zeros(param.shape, dtype=dtype)
            if ".lora_A." in name:
                seeded = torch.Generator().manual_seed(zlib.crc32(name.encode()))
                value.uniform_(-1.0 / math.sqrt(param.shape[1]), 1.0 / math.sqrt(param.shape[1]), generator=seeded)
        model.get_submodule(owner).register_parameter(leaf, torch.nn.Parameter(value))


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


def save_sharded(model: torch.nn.Module, gang: Gang, path: str | Path, merged: bool = False) -> None:
    """`save` for an FSDP2-sharded model (a collective: every rank calls it): the adapter gathered (it is
    small) and written by the leader in peft's format; with `merged`, the merged model at path/merged with
    each rank writing its own rows of every weight (``W + scale * B @ A`` of a target's rows needs only
    that B's rows: FSDP2 shards W and B alike along dim 0), nothing of the base gathered."""
    trainable = ((name, p) for name, p in model.named_parameters() if p.requires_grad)
    gathered = {name: t.cpu() for name, t in fsdp.whole_tensors(trainable)}
    if gang.leader:
        model.save_pretrained(str(path), state_dict=gathered)
    if merged:
        _save_merged(model, gang, Path(path) / "merged", gathered)


@torch.no_grad()
def _save_merged(model: torch.nn.Module, gang: Gang, folder: Path, gathered: dict[str, torch.Tensor]) -> None:
    import peft

    base = model.get_base_model()
    scales = {}  # a target's base weight name -> (B's name in `base`, A whole, scale)
    for name, module in base.named_modules():
        if isinstance(module, peft.tuners.lora.LoraLayer):
            if module.fan_in_fan_out or module.use_dora.get(ADAPTER) or module.lora_bias.get(ADAPTER):
                raise ValueError(f"{name}: only plain LoRA on nn.Linear is merged shard by shard")
            a = gathered[f"base_model.model.{name}.lora_A.{ADAPTER}.weight"]
            scales[f"{name}.base_layer.weight"] = (f"{name}.lora_B.{ADAPTER}.weight", a, module.scaling[ADAPTER])
    tensors = dict(sharded_save.saved_tensors(base))
    parts = []
    for name, tensor in tensors.items():
        if ".lora_" in name:
            continue
        piece = sharded_save.pieces([(name.replace(".base_layer.", "."), tensor)])[0]
        if name in scales:
            b_name, a, scale = scales[name]
            b = sharded_save.pieces([(b_name, tensors[b_name])])[0]
            if b.first_row != piece.first_row:
                raise ValueError(
                    f"{name}: its shard and its adapter's B start at rows {piece.first_row}, {b.first_row}"
                )
            merged = functools.partial(_merged_rows, piece.local, b.local, a, scale)  # made as it is written
            piece = dataclasses.replace(piece, local=merged)
        parts.append(piece)
    sharded_save.write_pieces(parts, gang, folder, base)


@torch.no_grad()
def _merged_rows(rows: torch.Tensor, b: torch.Tensor, a: torch.Tensor, scale: float) -> torch.Tensor:
    """A target's rows of ``W + scale * B @ A`` as peft's merge makes them: the delta in the adapter's dtype,
    added in place to a copy of the base weight's rows."""
    merged = rows.clone()
    merged += (b @ a.to(b.device)) * scale
    return merged
