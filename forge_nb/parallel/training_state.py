"""A policy's training state on disk, each rank writing its own shards (`torch.distributed.checkpoint`),
readable at any number of ranks; and a whole copy of a sharded model, on the leader, for the HF files of a
model that was loaded whole (one made from its rows writes them by rows: `sharded_save`).

The saved state is the trainable weights and their AdamW state, keyed by parameter name (DCP's
"FQN" state dicts), so a checkpoint written by 2 ranks loads into 1 or 4, or into a plain model, and
back, bit for bit. Frozen weights (LoRA's base) are not in it: they come from the model's directory.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Iterator
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict, set_state_dict

from forge_nb.parallel.fsdp import local_bytes, whole
from forge_nb.parallel.gang import Gang

FOLDER = "sharded"  # under a checkpoint's trainer/ folder
_OPTIONS = StateDictOptions(ignore_frozen_params=True)


@contextlib.contextmanager
def _one_process_is_meant() -> Iterator[None]:
    """Without a process group (a one-proc trainer) DCP warns, at every save and load, that it assumes one
    process: that is what is meant, and the warning would reach every notebook cell that checkpoints."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable or uninitialized")
        yield


def save(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Write this rank's shards of the trainable weights and optimizer state into folder/sharded
    (every rank of a gang calls it)."""
    weights, optim = get_state_dict(model, optimizer, options=_OPTIONS)
    with _one_process_is_meant():
        dcp.save({"model": weights, "optimizer": optim}, checkpoint_id=str(Path(folder) / FOLDER))


def load(folder: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Read folder/sharded into `model` and `optimizer`, resharded to this gang (every rank calls it).
    Raises `ValueError` when a trainable weight is not in it (a checkpoint of another model or adapter)."""
    weights, optim = get_state_dict(model, optimizer, options=_OPTIONS)  # also creates AdamW's state to fill
    saved = {"model": weights, "optimizer": optim}
    with _one_process_is_meant():
        dcp.load(saved, checkpoint_id=str(Path(folder) / FOLDER))
    # Not strict: the frozen weights (LoRA's base) are not in the state, by design.
    loose = StateDictOptions(ignore_frozen_params=True, strict=False)
    result = set_state_dict(
        model, optimizer, model_state_dict=saved["model"], optim_state_dict=saved["optimizer"], options=loose
    )
    trainable = {n for n, p in model.named_parameters() if p.requires_grad}
    missing = sorted(set(result.missing_keys) & trainable)
    if missing:
        raise ValueError(f"{folder}: the saved state lacks trainable weights {missing[:3]} (of {len(missing)})")


def exists(folder: str | Path) -> bool:
    return (Path(folder) / FOLDER / ".metadata").is_file()


def rank_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes this rank holds of the parameters, their gradients (as many as the trainable parameters,
    counted whether or not a backward has made them yet) and the optimizer's state."""
    params = list(model.parameters())
    total = local_bytes(params) + local_bytes(p for p in params if p.requires_grad)
    if optimizer is not None:
        total += local_bytes(v for s in optimizer.state.values() for v in s.values() if isinstance(v, torch.Tensor))
    return total


def whole_copy(model: nn.Module, gang: Gang) -> nn.Module | None:
    """A plain (unsharded) copy of `model` on the leader's CPU, from every rank's shards (a collective:
    every rank calls it) -> the copy on the leader, None elsewhere. Built on the meta device and given
    the gathered tensors, so it costs one copy of the weights, not an initialisation."""
    gathered = {}
    for name, tensor in model.state_dict().items():
        full = whole(tensor)  # a collective: every rank takes part, only the leader keeps what it gathered
        if gang.leader:
            gathered[name] = full.cpu()
        del full
    if not gang.leader:
        return None
    from transformers import AutoModelForCausalLM

    from forge_nb.lora import adapter

    config = model.config  # the model's own (its directory may be a checkpoint pruned since)
    with torch.device("meta"):
        copy = AutoModelForCausalLM.from_config(config, dtype=next(iter(gathered.values())).dtype)
    peft_config = getattr(model, "peft_config", None)
    if peft_config is not None:
        import peft

        copy = peft.get_peft_model(copy, peft_config[adapter.ADAPTER])
    copy.load_state_dict(gathered, assign=True)
    copy.tie_weights()  # assign=True gave the tied embedding and head their own (equal) tensors
    return copy
