"""A sharded policy built from an HF directory without a whole copy of the model on any rank.

The model is made with its parameters on the meta device (its buffers real: rotary tables are computed,
not stored), prepared as the caller says (a LoRA adapter, frozen weights, checkpointing) and wrapped with
FSDP2 as it is (torchtitan's order). Only then does it get memory, for this rank's shards, and each shard
is filled with its own rows of the weights files (`safetensors_rows`): a rank's peak host memory is its
shards, not the model, and N ranks on one host read the model once between them, not N times.

The same tensors as `from_pretrained` gives, bit for bit (the file's values, cast to the asked dtype as it
casts them). Where the directory's tensors are not the model's own (no safetensors files; other names or
shapes: transformers renames or fuses some models' weights when it loads them), `build` says so and the
caller loads the model whole, as before.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from forge_nb.parallel.safetensors_rows import RowReader, Stored, stored_tensors


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no initialisation cost)
    and keep their buffers real (accelerate's `init_empty_weights(include_buffers=False)`, without the
    dependency)."""
    register = nn.Module.register_parameter

    def on_meta(module: nn.Module, name: str, param: nn.Parameter | None) -> None:
        register(module, name, param)
        if param is not None and not param.is_meta:  # one already there is kept: a tie is the same object
            kept = dict(param.__dict__)  # transformers marks parameters (`_is_hf_initialized`)
            meta = type(param)(param.to("meta"), requires_grad=param.requires_grad)
            meta.__dict__.update(kept)
            module._parameters[name] = meta

    nn.Module.register_parameter = on_meta
    try:
        yield
    finally:
        nn.Module.register_parameter = register


def build(
    source: str,
    dtype: torch.dtype,
    prepare: Callable[[nn.Module], nn.Module],
    shard: Callable[[nn.Module], nn.Module],
    device: torch.device,
    params_device: torch.device,
) -> nn.Module | None:
    """The model in `source` (an HF directory) in `dtype`, `prepare`d, `shard`ed (FSDP2) and filled with
    this rank's rows -> the model; None when the directory's tensors are not the model's own (see the
    module docstring). `prepare` may add parameters of its own (a LoRA adapter); they must be real when
    it returns. `params_device`: where the shards live (the CPU with FSDP2's CPU offload), `device`: where
    the model computes (its buffers)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    stored = stored_tensors(source)
    if stored is None:
        return None
    config = AutoConfig.from_pretrained(source)
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    if not _same_tensors(model, stored):
        return None
    with contextlib.suppress(OSError):  # the directory's own generation settings, as from_pretrained reads them
        model.generation_config = GenerationConfig.from_pretrained(source)
    model.config.name_or_path = source
    model.eval()  # as from_pretrained leaves it
    from_file = {id(p): name for name, p in model.named_parameters()}
    model = prepare(model)
    file_names = {name: from_file[id(p)] for name, p in model.named_parameters() if id(p) in from_file}
    kept = {name: t for name, t in _tensors(model) if not t.is_meta}
    missing = [name for name, t in _tensors(model) if t.is_meta and name not in file_names]
    if missing:
        raise ValueError(f"{missing[:3]} are on the meta device after preparing the model, and not in {source}")
    model = shard(model)
    model.to_empty(device=params_device)
    with RowReader(stored) as reader, torch.no_grad():
        for name, param in model.named_parameters():
            if name in kept:
                _fill(param, _from_memory(kept[name]))
            else:
                _fill(param, lambda start, dest, key=file_names[name]: reader.read_into(key, start, dest))
        for module_name, module in model.named_modules():
            for name, buffer in module._buffers.items():
                if buffer is not None:
                    full = f"{module_name}.{name}" if module_name else name
                    module._buffers[name] = kept[full].to(device)
    return model


def _same_tensors(model: nn.Module, stored: dict[str, Stored]) -> bool:
    """Whether every parameter of `model` is stored under its own name with its own shape."""
    return all(name in stored and stored[name].shape == tuple(p.shape) for name, p in model.named_parameters())


def _tensors(model: nn.Module) -> list[tuple[str, torch.Tensor]]:
    return [*model.named_parameters(), *model.named_buffers()]


def _from_memory(whole: torch.Tensor) -> Callable[[int, torch.Tensor], None]:
    """A reader of rows of a tensor already in memory (a buffer, an adapter made or loaded on the CPU)."""

    def read(start: int, dest: torch.Tensor) -> None:
        dest.copy_(whole[start : start + dest.shape[0]] if whole.dim() else whole)

    return read


def _fill(param: torch.Tensor, read: Callable[[int, torch.Tensor], None]) -> None:
    """This rank's rows of a parameter (a DTensor's local shard, or a whole tensor): `read(first row, dest)`."""
    if isinstance(param, DTensor):
        _, offset = compute_local_shape_and_global_offset(param.shape, param.device_mesh, param.placements)
        local = param.to_local()
        if local.numel():
            read(offset[0] if offset else 0, local)
    else:
        read(0, param)
