"""A sharded policy built from an HF directory without a whole copy of the model on any rank.

The model is made with its parameters on the meta device (its buffers real: rotary tables are computed,
not stored), prepared as the caller says (a LoRA adapter, frozen weights, checkpointing) and wrapped with
FSDP2 as it is (torchtitan's order). Only then does it get memory, for this rank's shards, and each shard
is filled with its own rows of the weights files (`safetensors_rows`): a rank's peak host memory is its
shards, not the model, and N ranks on one host read the model once between them, not N times.

The same tensors as `from_pretrained` gives, bit for bit (the file's values, cast to the asked dtype as it
casts them; the persistent buffers it stores read from it too). Where the directory is not the model's own
tensors as they are -- no safetensors files; other names or shapes, or tensors the model lacks (transformers
renames or fuses some models' weights as it loads them); a quantization config; modules transformers keeps
in float32 under a 16-bit dtype -- `build` says why (`NotByRows`) and the caller loads the model whole.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from forge_nb.parallel.fsdp import first_row
from forge_nb.parallel.safetensors_rows import RowReader, Stored, stored_tensors


@contextlib.contextmanager
def parameters_on_meta() -> Iterator[None]:
    """Modules built inside get their parameters on the meta device (no memory, no initialisation cost)
    and keep their buffers real (accelerate's `init_empty_weights(include_buffers=False)`, without the
    dependency). It patches `nn.Module.register_parameter` while it lasts, for the whole process: a trainer
    proc builds its model before anything else runs in it."""
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


class NotByRows(Exception):  # noqa: N818 -- an answer, not a failure: the caller loads the model whole
    """The directory cannot be read by rows (the message says why): load the model whole."""


def build(
    source: str,
    dtype: torch.dtype,
    prepare: Callable[[nn.Module], nn.Module],
    shard: Callable[[nn.Module], nn.Module],
    device: torch.device,
    params_device: torch.device,
) -> nn.Module:
    """The model in `source` (an HF directory) in `dtype`, `prepare`d, `shard`ed (FSDP2) and filled with
    this rank's rows -> the model. Raises `NotByRows` (why) when the directory is not the model's own tensors
    as they are (see the module docstring). `prepare` may add parameters of its own (a LoRA adapter); they
    must be real when it returns. `params_device`: where the shards live (the CPU with FSDP2's CPU offload),
    `device`: where the model computes (its buffers)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    stored = stored_tensors(source)
    if stored is None:
        raise NotByRows("no safetensors files (or a dtype they hold that torch has no name for)")
    config = AutoConfig.from_pretrained(source)
    if getattr(config, "quantization_config", None) is not None:
        raise NotByRows("a quantization config: transformers quantizes (or dequantizes) the weights as it loads them")
    with parameters_on_meta():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    _check_own_tensors(model, stored, dtype)
    with contextlib.suppress(OSError):  # the directory's own generation settings, as from_pretrained reads them
        model.generation_config = GenerationConfig.from_pretrained(source)
    model.config.name_or_path = source
    model.eval()  # as from_pretrained leaves it
    from_file = {id(p): name for name, p in model.named_parameters()}
    state = set(model.state_dict())  # a persistent buffer is in the state dict: from_pretrained reads it
    stored_buffers = {id(b): name for name, b in model.named_buffers() if name in state and name in stored}
    model = prepare(model)
    file_names = {name: from_file[id(p)] for name, p in model.named_parameters() if id(p) in from_file}
    kept = {name: p for name, p in model.named_parameters() if not p.is_meta}
    missing = [name for name, p in model.named_parameters() if p.is_meta and name not in file_names]
    if missing:
        raise ValueError(f"{missing[:3]} are on the meta device after preparing the model, and not in {source}")
    buffers = [(module, n, b) for module in model.modules() for n, b in module._buffers.items() if b is not None]
    model = shard(model)
    _to_empty(model, params_device)
    with RowReader(stored) as reader, torch.no_grad():
        for name, param in model.named_parameters():
            if name in kept:
                _fill(param, _from_memory(kept[name]))
            else:
                _fill(param, lambda start, dest, key=file_names[name]: reader.read_into(key, start, dest))
        _restore_buffers(buffers, device, reader, stored_buffers)
    return model


def _to_empty(model: nn.Module, device: torch.device) -> None:
    """Memory for every parameter on `device`, uninitialised; each keeps its identity (a tie stays one tensor:
    FSDP2's DTensors are swapped in place anyway, a plain parameter off the meta device would be replaced)."""
    swap = torch.__future__.get_swap_module_params_on_conversion()
    torch.__future__.set_swap_module_params_on_conversion(True)
    try:
        model.to_empty(device=device)
    finally:
        torch.__future__.set_swap_module_params_on_conversion(swap)


def _check_own_tensors(model: nn.Module, stored: dict[str, Stored], dtype: torch.dtype) -> None:
    """Raise `NotByRows` unless `from_pretrained` would give `model` the stored tensors as they are: every
    parameter stored under its own name and shape, every stored persistent buffer of its shape, nothing else
    stored but what the model ignores on load, and no module it would keep in float32 while the rest is
    16-bit."""
    state = model.state_dict()  # parameters (a tied one under each name) and persistent buffers
    renamed = "transformers renames or fuses this model's weights as it loads them, or the files are of another model"
    for name, tensor in [*model.named_parameters(), *state.items()]:
        if name not in stored and isinstance(tensor, nn.Parameter):
            raise NotByRows(f"the files have no {name} ({renamed})")
        if name in stored and stored[name].shape != tuple(tensor.shape):
            raise NotByRows(f"{name} is {stored[name].shape} in the files, {tuple(tensor.shape)} in the model")
    ignored = [re.compile(p) for p in getattr(model, "_keys_to_ignore_on_load_unexpected", None) or ()]
    extra = [n for n in stored if n not in state and not any(p.search(n) for p in ignored)]
    if extra:
        raise NotByRows(f"the files hold {extra[0]} (and {len(extra) - 1} more) the model has not ({renamed})")
    in_fp32 = [*(model._keep_in_fp32_modules or ()), *(getattr(model, "_keep_in_fp32_modules_strict", None) or ())]
    if in_fp32 and dtype in (torch.float16, torch.bfloat16):
        raise NotByRows(f"transformers keeps {in_fp32} in float32 when the model is {dtype}")


def _restore_buffers(buffers: list, device: torch.device, reader: RowReader, stored: dict[int, str]) -> None:
    """Put back every buffer `to_empty` emptied, on the compute `device` (one made in the model's
    constructor keeps its value; a buffer two modules share stays one tensor), then read the persistent
    ones the directory stores (`stored`: a buffer's id -> its name there) from it, as from_pretrained does."""
    moved: dict[int, torch.Tensor] = {}
    for module, name, buffer in buffers:
        if id(buffer) not in moved:
            moved[id(buffer)] = buffer.to(device)
            if id(buffer) in stored:
                reader.read_into(stored[id(buffer)], 0, moved[id(buffer)])
        module._buffers[name] = moved[id(buffer)]


def _from_memory(whole: torch.Tensor) -> Callable[[int, torch.Tensor], None]:
    """A reader of rows of a tensor already in memory (a buffer, an adapter made or loaded on the CPU)."""

    def read(start: int, dest: torch.Tensor) -> None:
        dest.copy_(whole[start : start + dest.shape[0]] if whole.dim() else whole)

    return read


def _fill(param: torch.Tensor, read: Callable[[int, torch.Tensor], None]) -> None:
    """This rank's rows of a parameter (a DTensor's local shard, or a whole tensor): `read(first row, dest)`."""
    if isinstance(param, DTensor):
        local = param.to_local()
        if local.numel():
            read(first_row(param), local)
    else:
        read(0, param)
