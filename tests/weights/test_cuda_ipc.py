"""The CUDA IPC transport where it cannot run: every way a reader or a publisher finds it unavailable says
so (the transport itself runs on a GPU: `make gpu-check`, `forge_nb.tools.gpu_check.refresh`)."""

import dataclasses

import pytest
import torch

from forge_nb.weights.cuda_ipc import IpcSpec, copy_stamped, open_snapshots
from forge_nb.weights.manifest import header, host_id
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import WeightReceiver

WEIGHTS = [("w", torch.randn(4, 3)), ("b", torch.randn(3))]


def test_no_spec_another_host_or_no_gpu_opens_nothing():
    assert open_snapshots(None) is None
    assert open_snapshots(IpcSpec("another-boot-id", "GPU-0", ((), ()))) is None
    if not torch.cuda.is_available():
        assert open_snapshots(IpcSpec(host_id(), "GPU-0", ((), ()))) is None


def test_auto_on_a_cpu_reader_takes_the_host_path_and_cuda_ipc_asked_for_says_why_not():
    publisher = WeightPublisher(WEIGHTS)
    manifest = dataclasses.replace(publisher.manifest(rdma=False), ipc=IpcSpec(host_id(), "GPU-0", ((), ())))
    assert WeightReceiver(manifest).transport == "shm"
    with pytest.raises(ValueError, match="'cuda_ipc' asked for, but the trainer's GPU snapshots cannot be opened"):
        WeightReceiver(manifest, transport="cuda_ipc")
    publisher.unlink()


def test_gpu_only_snapshots_need_a_gpu_and_a_reader_that_can_open_them():
    with pytest.raises(ValueError, match="needs a CUDA device"):
        WeightPublisher(WEIGHTS, host=False)
    manifest = dataclasses.replace(WeightPublisher(WEIGHTS, use_shm=False).manifest(rdma=False), stream=None)
    with pytest.raises(ValueError, match="on its GPU only: this reader cannot open them"):
        WeightReceiver(manifest)


def test_a_stamped_copy_takes_the_header_before_and_after_the_body():
    source = torch.arange(256, dtype=torch.uint8)
    header(source)[:] = torch.tensor([7, 99])
    staging = torch.zeros(256, dtype=torch.uint8)
    after = copy_stamped(source, staging)
    assert torch.equal(staging, source) and after.tolist() == [7, 99]


class _GpuStandIn:
    """Where a CUDA publisher keeps its GPU snapshots (this machine has no GPU): takes publishes, keeps nothing."""

    def publish(self, *args) -> None:
        pass

    def handles(self) -> None:
        return None


def test_host_copies_stop_when_every_reader_is_on_the_gpu_and_restart_with_the_version_published_last():
    import asyncio

    weights = dict(WEIGHTS)
    publisher = WeightPublisher(weights.items())
    publisher.keep_host(False, weights.items())
    assert publisher.host_live  # no GPU snapshots: the host copies are the only ones
    publisher.gpu = _GpuStandIn()
    publisher.keep_host(False, weights.items())
    moved = {name: t + 1 for name, t in weights.items()}
    publisher.publish(moved.items(), 1)
    assert int(header(publisher.buffers[1])[0]) != 1  # not copied to host memory
    publisher.keep_host(True, moved.items())
    loaded = {}
    report = asyncio.run(WeightReceiver(publisher.manifest(rdma=False)).refresh(1, lambda named: loaded.update(named)))
    assert report.version == 1 and all(torch.equal(loaded[n], moved[n]) for n in moved)
    publisher.unlink()


def test_gpu_snapshots_no_reader_opened_are_freed_unless_they_are_the_only_ones():
    publisher = WeightPublisher(WEIGHTS)
    publisher.gpu = _GpuStandIn()
    assert publisher.drop_gpu() and publisher.gpu is None
    publisher.publish(((n, t + 1) for n, t in WEIGHTS), 1)  # host buffers only from now on
    assert int(header(publisher.buffers[1])[0]) == 1
    publisher.buffers = []  # as with weights.transport="cuda_ipc": no host buffers
    publisher.gpu = _GpuStandIn()
    assert not publisher.drop_gpu()
    publisher.unlink()
