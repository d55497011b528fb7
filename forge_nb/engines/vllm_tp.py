"""vLLM with ``tensor_parallel_size > 1``: its workers are processes of their own, each holding a slice of the model.

With one rank the engine runs in the generator's process and a refresh hands vLLM's ``reload_weights`` an
iterator of tensors. A worker in another process cannot read that iterator, so with several ranks the
generator writes the new version's tensors once into a file in ``/dev/shm`` (`write_weights`: one copy, at
memory speed, of what the refresh already checked), and each rank maps that file and hands its own
``reload_weights`` views of it (`reload_from_file`, run in every worker by ``collective_rpc``): vLLM's loader
takes each rank's slice of a tensor from the view, so a rank reads only the pages of its slice. The file is
removed once every rank has returned. What reaches it was checked whole first (the refresh's version checks),
as for one rank; a rank that raised while loading fails the refresh, as one rank's reload does.

On CPU, vLLM binds each rank's OpenMP threads to cores of its own (``VLLM_CPU_OMP_THREADS_BIND``); unless
that is set, `cpu_binding` splits the cores this process may use among the ranks.
"""

from __future__ import annotations

import os
import tempfile
import uuid
from collections.abc import Iterable
from pathlib import Path

import torch

#: name -> (byte offset, bytes, shape, dtype name) of each tensor in the file `write_weights` wrote.
Layout = dict[str, tuple[int, int, list[int], str]]
ALIGN = 64  # bytes: every tensor starts at a multiple (a cache line; any element size divides it)


def cpu_binding(ranks: int) -> str:
    """``VLLM_CPU_OMP_THREADS_BIND`` for `ranks` ranks: this process's cores split in contiguous groups
    ("0,1|2,3"), or "nobind" with fewer cores than ranks (the ranks then share them)."""
    cores = sorted(os.sched_getaffinity(0))
    if len(cores) < ranks:
        return "nobind"
    size = len(cores) // ranks
    return "|".join(",".join(str(c) for c in cores[r * size : (r + 1) * size]) for r in range(ranks))


def write_weights(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> tuple[str, Layout]:
    """Write the tensors one after another into a new file in /dev/shm (the temp folder without it) ->
    (its path, its layout)."""
    folder = Path("/dev/shm") if Path("/dev/shm").is_dir() else Path(tempfile.gettempdir())
    path = folder / f"forge_nb-vllm-weights-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    layout: Layout = {}
    offset = 0
    try:
        with open(path, "wb") as f:
            for name, tensor in named_tensors:
                data = tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8)
                f.write(bytes(-offset % ALIGN))  # each tensor at a multiple of its element size (a view needs it)
                offset += -offset % ALIGN
                f.write(memoryview(data.numpy()))
                layout[name] = (offset, data.numel(), list(tensor.shape), str(tensor.dtype).removeprefix("torch."))
                offset += data.numel()
    except BaseException:
        path.unlink(missing_ok=True)  # /dev/shm is memory: a half-written file must not stay
        raise
    return str(path), layout


def reload_from_file(worker, path: str, layout: Layout) -> None:
    """In a vLLM worker: reload the model from views of the file `write_weights` wrote (vLLM's own
    reload: fusing, slicing to this rank, and its CPU repacking, as on a cold load)."""
    size = max((offset + n for offset, n, _, _ in layout.values()), default=0)
    data = torch.from_file(path, shared=False, size=size, dtype=torch.uint8)  # mapped: pages read on use

    def views():
        for name, (offset, n, shape, dtype) in layout.items():
            yield name, data[offset : offset + n].view(getattr(torch, dtype)).view(shape)

    worker.reload_weights(weights_iterator=views())


def named_parameters(worker) -> list[tuple[str, torch.Tensor]]:
    """In a vLLM worker: its rank's parameters (vLLM's names and layout, its slice), on the CPU."""
    model = worker.model_runner.get_model()
    return [(name, p.detach().to("cpu")) for name, p in model.named_parameters()]
