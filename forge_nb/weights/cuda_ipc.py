"""Weights through CUDA IPC: a trainer's two snapshots in its GPU's memory, opened by a generator on a
GPU of the same host and copied device to device ("cuda_ipc" transport; no trip through host memory).

The publisher lays the snapshots out exactly as its host buffers (`weights.manifest`: a 64-byte header
with the version and the publisher's nonce, then every tensor) and finishes every publish with a stream
synchronize, so a version is whole in GPU memory when `publish` returns. It hands over torch's IPC
handles of both buffers (`torch.multiprocessing.reductions.reduce_tensor`) with the GPU's UUID: a reader
opens them on whichever of its visible devices has that UUID (a proc's ``CUDA_VISIBLE_DEVICES`` numbers
the GPUs its own way). A reader that does not see that GPU, or sits on another host, cannot use them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from forge_nb.weights.manifest import WRITING, TensorSlot, header, host_id, stamped_copy, views

_DEVICE_ARG = 6  # storage_device in the arguments of torch.multiprocessing.reductions.rebuild_cuda_tensor


@dataclass(frozen=True)
class IpcSpec:
    """Where a publisher's GPU snapshots are: the host (boot id), the GPU's UUID and, per buffer, the
    arguments torch rebuilds it from in another process."""

    host: str
    gpu: str
    buffers: tuple[tuple, ...]


def gpu_uuid(index: int) -> str:
    return str(torch.cuda.get_device_properties(index).uuid)


class GpuSnapshots:
    """The two snapshot buffers of one publisher in the memory of CUDA `device`."""

    def __init__(self, nbytes: int, device: torch.device) -> None:
        self.device = device
        self.buffers = [torch.empty(nbytes, dtype=torch.uint8, device=device) for _ in range(2)]
        for buffer in self.buffers:
            header(buffer)[0] = WRITING
        self._targets: list[dict[str, torch.Tensor]] | None = None

    def publish(
        self, named: Sequence[tuple[str, torch.Tensor]], slots: Sequence[TensorSlot], version: int, nonce: int
    ) -> None:
        """`named` into buffer `version % 2`, whole in GPU memory when this returns."""
        if self._targets is None:
            self._targets = [dict(views(b, slots)) for b in self.buffers]
        with torch.cuda.device(self.device):
            stamped_copy(self.buffers[version % 2], self._targets[version % 2], named, version, nonce)
            torch.cuda.current_stream().synchronize()

    def handles(self) -> IpcSpec:
        from torch.multiprocessing.reductions import reduce_tensor

        index = self.device.index if self.device.index is not None else torch.cuda.current_device()
        return IpcSpec(host_id(), gpu_uuid(index), tuple(reduce_tensor(b)[1] for b in self.buffers))


def open_snapshots(spec: IpcSpec | None) -> list[torch.Tensor] | None:
    """The publisher's two GPU buffers mapped into this process, or None where they cannot be: no spec,
    another host, no GPU here, or not the publisher's GPU among those this process sees."""
    if spec is None or spec.host != host_id() or not torch.cuda.is_available():
        return None
    local = next((i for i in range(torch.cuda.device_count()) if gpu_uuid(i) == spec.gpu), None)
    if local is None:
        return None
    from torch.multiprocessing.reductions import rebuild_cuda_tensor

    opened = []
    for args in spec.buffers:
        args = list(args)
        args[_DEVICE_ARG] = local
        opened.append(rebuild_cuda_tensor(*args))
    return opened


def copy_stamped(source: torch.Tensor, staging: torch.Tensor) -> torch.Tensor:
    """`source` into `staging` (either device): header first, then the rest, then the header again ->
    that last header on the CPU. Copies run in order on this stream, so a publish that overlapped the
    copy shows in one of the two headers (`weights.refresh` checks both)."""
    staging[:64].copy_(source[:64])
    staging[64:].copy_(source[64:])
    after = source[:64].to("cpu")  # waits for the copies before it
    return header(after).clone()
