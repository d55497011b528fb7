"""FSDP2 over a gang: each decoder block and the root sharded on the gang's device mesh (as torchtitan
wraps its models), and whole tensors gathered back when a whole copy is needed (a checksum, the HF files of
a model loaded whole); a refresh and a save of a model made from its rows never gather (`sharded_save`).

Gradients are summed over the ranks, never averaged: each rank back-propagates its own rows' part of
the whole batch's loss (`rl.update.policy_update`), so their sum is the whole batch's gradient.
Summing also sidesteps the gloo trap (pytorch issue 162338: FSDP2's reduce-scatter on gloo summed where
it should average): with every FSDP module forced to SUM with divide factor 1, gloo and NCCL do the same.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator

import torch
from torch import nn
from torch.distributed.fsdp import CPUOffloadPolicy, FSDPModule, MixedPrecisionPolicy, OffloadPolicy, fully_shard
from torch.distributed.tensor import DTensor
from torch.distributed.tensor._utils import compute_local_shape_and_global_offset

from forge_nb.parallel.gang import Gang


def decoder_blocks(model: nn.Module) -> list[nn.Module]:
    """The model's repeated blocks: modules of the classes an HF model lists in `_no_split_modules`
    (LlamaDecoderLayer, ...; found through a peft wrapper too), in order."""
    names: set[str] = set()
    for module in model.modules():
        names.update(getattr(module, "_no_split_modules", None) or ())
    blocks = [m for m in model.modules() if type(m).__name__ in names]
    if not blocks:
        raise ValueError(f"{type(model).__name__} names no decoder block class (_no_split_modules); cannot shard it")
    return blocks


def shard(model: nn.Module, gang: Gang, mixed_precision: str = "none", cpu_offload: bool = False) -> nn.Module:
    """Wrap `model` with FSDP2 in place (each decoder block, then the root) -> the same module.
    `mixed_precision` "bf16": compute in bfloat16, reduce gradients in float32 (parameters stay in their
    dtype); `cpu_offload`: shards, gradients and optimizer state in host memory between uses."""
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    options = {
        "mesh": gang.mesh,
        "mp_policy": mp if mixed_precision == "bf16" else MixedPrecisionPolicy(),
        "offload_policy": CPUOffloadPolicy() if cpu_offload else OffloadPolicy(),
    }
    for block in decoder_blocks(model):
        fully_shard(block, **options)
    fully_shard(model, **options)
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.set_force_sum_reduction_for_comms(True)
            module.set_gradient_divide_factor(1.0)
    return model


def whole(tensor: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a shard's gathered from every rank (a collective: every rank calls it in the
    same order), anything else as it is."""
    return tensor.full_tensor() if isinstance(tensor, DTensor) else tensor


def whole_tensors(named: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, whole tensor) one at a time, so that at most one gathered parameter is alive at once."""
    for name, tensor in named:
        yield name, whole(tensor.detach())


def local_bytes(tensors: Iterable[torch.Tensor]) -> int:
    """Bytes this rank holds of `tensors` (a shard's local part only)."""
    return sum((t.to_local() if isinstance(t, DTensor) else t).nbytes for t in tensors)


def reshard(model: nn.Module) -> None:
    """Every FSDP2 module back to its shards (a forward without a backward leaves the root's whole)."""
    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


def reset_iteration(model: nn.Module) -> None:
    """FSDP2's per-iteration state cleared after a forward or backward that raised, so the next step runs:
    `FSDPModule.reset_iter_state()` on the root, from torch 2.13 on. torch 2.11 and 2.12 (inside forge_nb's
    range) lack it; there the same steps run on FSDP2's private state, as 2.13's method takes them: every
    in-flight collective waited on and dropped, every state and parameter group idle and back to its shards."""
    if hasattr(model, "reset_iter_state"):
        model.reset_iter_state()
        return
    from torch.distributed.fsdp._fully_shard._fsdp_common import TrainingState

    root = model._get_fsdp_state()
    stream, comm = root._device_handle.current_stream(), root._comm_ctx
    if (gathered := comm.all_gather_state) is not None and gathered.event is not None:
        stream.wait_event(gathered.event)
    comm.all_gather_state = None
    if hasattr(comm, "reduce_scatter_states"):  # 2.12: a list
        scattered, comm.reduce_scatter_states = list(comm.reduce_scatter_states), []
    else:  # 2.11: one
        scattered, comm.reduce_scatter_state = [comm.reduce_scatter_state], None
    for pending in scattered:
        if pending is not None and pending.event is not None:
            stream.wait_event(pending.event)
    comm.post_forward_order.clear()
    for st in root._state_ctx.all_states:
        st._modules_to_run_forward.clear()
        st._training_state = TrainingState.IDLE
        groups = st._fsdp_param_groups if hasattr(st, "_fsdp_param_groups") else [st._fsdp_param_group]  # 2.12 / 2.11
        for group in filter(None, groups):
            if (result := group._all_gather_result) is not None:
                if result.all_gather_event is not None:
                    stream.wait_event(result.all_gather_event)
                if isinstance(result.all_gather_work, torch.distributed.distributed_c10d.Work):
                    result.all_gather_work.wait()
                group._all_gather_result = None
            if group._post_reduce_event is not None:
                stream.wait_event(group._post_reduce_event)
                group._post_reduce_event = None
            if group._all_reduce_state is not None and group._all_reduce_state.event is not None:
                stream.wait_event(group._all_reduce_state.event)
            group._all_reduce_state = None
            if group._reshard_after_forward_event is not None:
                group._wait_all_gather_streams_on_event(group._reshard_after_forward_event)
                group._reshard_after_forward_event = None
            group._partial_reduce_output = None
            group._post_forward_indices.clear()
            group._training_state = TrainingState.IDLE
            group._to_sharded()
    root._state_ctx.iter_forward_root = None
    root._state_ctx.post_backward_final_callback_queued = False


def first_row(tensor: DTensor) -> int:
    """The row of the whole tensor this rank's shard starts at (FSDP2 shards dim 0; 0 for a 0-dim one)."""
    _, offset = compute_local_shape_and_global_offset(tensor.shape, tensor.device_mesh, tensor.placements)
    return offset[0] if offset else 0


def local_shards(
    named: Iterable[tuple[str, torch.Tensor]],
) -> tuple[list[tuple[str, torch.Tensor]], dict[str, tuple[int, int]]]:
    """This rank's own rows of each tensor -> ((name, local tensor) in order, name -> (first row, the
    whole tensor's rows) for those that are shards). No collective: what a rank publishes is its own."""
    out, rows = [], {}
    for name, tensor in named:
        if isinstance(tensor, DTensor):
            rows[name] = (first_row(tensor), tensor.shape[0] if tensor.dim() else 1)
            tensor = tensor.to_local()
        out.append((name, tensor.detach()))
    return out, rows
