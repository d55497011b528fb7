"""vLLM with ``tensor_parallel_size > 1``: its workers are processes of their own, each holding a slice of the model.

With one rank the engine runs in the generator's process and a refresh hands vLLM's ``reload_weights`` an
iterator of tensors. A worker in another process cannot read that iterator, so with several ranks the
generator writes the new version's tensors once into an anonymous memory file (`write_weights`: one copy, at
memory speed, of what the refresh already checked; ``memfd_create``, so it is freed with its last descriptor
even if the proc is killed, and no /dev/shm size limit applies), and each rank maps it through
``/proc/PID/fd/N`` and hands its own ``reload_weights`` views of it (`reload_from_file`, run in every worker
by ``collective_rpc``): vLLM's loader takes each rank's slice of a tensor from the view, so a rank reads only
the pages of its slice. The file is closed after the call, whether it returned or raised. What reaches it was
checked whole first (the refresh's version checks), as for one rank; a rank that raises while loading fails
the refresh, and, as with one rank, the replica is held torn (`weights.refresh.TornWeights`: it samples nothing)
and the session replaces it. A rank whose worker process dies leaves vLLM's executor shut down for good: the
generator proc then ends itself (`lost_ranks` says why) and the session starts it afresh, as a killed one.

On a CPU the ranks share the cores as every proc of a local mesh does, splitting the generator proc's
threads (`forge_nb.actors.base` sets them: ``threads_per_proc``) among them: vLLM's own binding of each rank
to cores of its own is turned off (``VLLM_CPU_OMP_THREADS_BIND=nobind``) unless set, since it would pin ranks
onto the trainer's cores and two replicas onto the same ones; ranks with more threads than cores between them
would spin against each other (far slower: `benchmarks/vllm_tp.py`, README).
"""

from __future__ import annotations

import os
from collections.abc import Iterable

import torch

#: name -> (byte offset, bytes, shape, dtype name) of each tensor in the file `write_weights` wrote.
Layout = dict[str, tuple[int, int, list[int], str]]
ALIGN = 64  # bytes: every tensor starts at a multiple (a cache line; any element size divides it)


def write_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[int, str, Layout]:
    """Write the tensors one after another (each at a multiple of `ALIGN` bytes) into a new anonymous memory
    file -> (its descriptor, which the caller closes; the path other processes open it by; its layout)."""
    fd = os.memfd_create("forge_nb-vllm-weights", os.MFD_CLOEXEC)
    layout: Layout = {}
    offset = 0
    try:
        with open(fd, "wb", closefd=False) as f:
            for name, tensor in named_tensors:
                data = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                f.write(bytes(-offset % ALIGN))  # each tensor at a multiple of its element size (a view needs it)
                offset += -offset % ALIGN
                f.write(memoryview(data.numpy()))
                layout[name] = (offset, data.numel(), list(tensor.shape), str(tensor.dtype).removeprefix("torch."))
                offset += data.numel()
    except BaseException:
        os.close(fd)
        raise
    return fd, f"/proc/{os.getpid()}/fd/{fd}", layout


def reload_from_file(worker, path: str, layout: Layout) -> None:
    """In a vLLM worker: reload the model from views of the file `write_weights` wrote (vLLM's own
    reload: fusing, slicing to this rank, and its CPU repacking, as on a cold load)."""
    size = max((offset + n for offset, n, _, _ in layout.values()), default=0)
    data = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)  # mapped: pages read on use

    def views():
        for name, (offset, n, shape, dtype) in layout.items():
            yield name, data[offset : offset + n].view(getattr(torch, dtype)).view(shape)

    worker.reload_weights(weights_iterator=views())


def lost_ranks(executor) -> str:
    """What a failed multiprocess `executor` lost: the worker processes no longer alive."""
    died = [w.proc.name for w in getattr(executor, "workers", None) or [] if not w.proc.is_alive()]
    return f"vLLM's worker {', '.join(died) or 'process'} died and vLLM shut its executor down"


def named_parameters(worker) -> list[tuple[str, torch.Tensor]]:
    """In a vLLM worker: its rank's parameters (vLLM's names and layout, its slice), on the CPU."""
    model = worker.model_runner.get_model()
    return [(name, p.detach().to("cpu")) for name, p in model.named_parameters()]
