"""Weight refresh throughput, one run, side by side, for several model sizes (GB/s = 1e9 bytes/s):

forge_nb (auto)   the product path between two procs: publish into the double buffer, pull, check,
                  load into the receiver's tensors (same host -> /dev/shm mapping)
forge_nb (rdma)   the same, forced over Monarch RDMABuffers, chunks read in parallel
forge_nb (group)  the same snapshot broadcast by the publisher's sender thread through a process group of
                  its own, on the receiver's request (weights.transport="group": gloo here, NCCL on GPUs),
                  checked and loaded as above
raw RDMABuffer    one RDMABuffer over the whole snapshot, one read_into (no load)
gloo broadcast    torch.distributed gloo, 2 processes, one tensor of the same size
memcpy            in-process tensor copy

  python benchmarks/weight_refresh.py [--sizes-mb 16 256 1024]
  python benchmarks/weight_refresh.py --hosts [--fanout 1 2 4]   # across namespace hosts (root): see
                                                                  # weight_refresh_hosts.py
  python benchmarks/weight_refresh.py --lora smollm2-135m-instruct [--engines torch vllm]   # full vs LoRA
                                                  # adapter refresh of a real model: see weight_refresh_lora.py
  python benchmarks/weight_refresh.py --sharded [--sizes-mb 256 1024] [--where host hosts]   # 2 trainer ranks
                                                  # -> 2 generators, shard-direct vs gather to rank 0: see
                                                  # weight_refresh_sharded.py
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import os
import statistics
import time
import warnings

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from monarch.actor import Actor, endpoint, this_host

from forge_nb.runtime.calls import wait
from forge_nb.weights.group import GroupSender, GroupSpec, group_spec
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import WeightReceiver

TENSORS = 8  # the "model" is this many equal fp32 tensors


def _named(size_bytes: int, fill: float) -> list[tuple[str, torch.Tensor]]:
    n = size_bytes // 4 // TENSORS
    return [(f"layer{i}.weight", torch.full((n,), fill)) for i in range(TENSORS)]


class Publisher(Actor):
    """A trainer's publisher of `size_bytes`; with `stream_secret`, it serves its TCP streams at `stream_host` to
    readers that prove the secret (as a session's trainer does)."""

    def __init__(self, size_bytes: int, stream_secret: bytes = b"", stream_host: str = "127.0.0.1") -> None:
        torch.set_num_threads(1)
        self.named = _named(size_bytes, 1.0)
        self.publisher = WeightPublisher(self.named, version=0, stream_secret=stream_secret, stream_host=stream_host)
        self.version = 0

    @endpoint
    def manifest(self):
        return self.publisher.manifest()

    @endpoint
    def step(self) -> int:
        self.version += 1
        self.publisher.publish(self.named, self.version)
        return self.version

    @endpoint
    def group(self) -> GroupSpec:
        self.spec = group_spec(("127.0.0.1",), 2, "gloo", 120.0)
        return self.spec

    @endpoint
    def join(self) -> None:
        self.sender = GroupSender(self.spec, self.publisher.snapshot, self.publisher.lock)

    @endpoint
    def raw_buffer(self):
        from monarch.rdma import RDMABuffer

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return RDMABuffer(self.publisher.buffers[0])

    @endpoint
    def unlink(self) -> None:
        self.publisher.unlink()


class Receiver(Actor):
    def __init__(self, size_bytes: int) -> None:
        torch.set_num_threads(1)
        self.params = dict(_named(size_bytes, 0.0))
        self.receivers: dict[str, WeightReceiver] = {}
        self.size = size_bytes

    def _load(self, named) -> None:
        for name, t in named:
            self.params[name].copy_(t)

    @endpoint
    async def attach(self, manifest, transport: str) -> str:
        make = lambda: WeightReceiver(manifest, 0, transport, member=1)  # noqa: E731
        self.receivers[transport] = await asyncio.to_thread(make)  # "group": joins while the publisher does
        return self.receivers[transport].transport

    @endpoint
    async def refresh(self, transport: str, version: int) -> float:
        report = await self.receivers[transport].refresh(version, self._load)
        self.transfer_seconds = report.transfer_seconds
        return report.seconds

    @endpoint
    async def last_transfer_seconds(self) -> float:
        """The copy alone (staging, before the version check and the load) of the last refresh."""
        return self.transfer_seconds

    @endpoint
    async def raw_read(self, buffer) -> float:
        dst = torch.empty(buffer.size(), dtype=torch.uint8)
        start = time.perf_counter()
        await buffer.read_into(dst)
        return time.perf_counter() - start


def gloo_broadcast_seconds(rank: int, world: int, size_bytes: int, reps: int) -> float:
    """This rank's median seconds of a gloo broadcast of `size_bytes` from rank 0 (MASTER_ADDR / MASTER_PORT
    set by the caller), after one warm-up broadcast."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    t = torch.ones(size_bytes // 4) if rank == 0 else torch.zeros(size_bytes // 4)
    dist.broadcast(t, src=0)  # warm-up
    times = []
    for _ in range(reps):
        dist.barrier()
        start = time.perf_counter()
        dist.broadcast(t, src=0)
        times.append(time.perf_counter() - start)
    dist.destroy_process_group()
    return statistics.median(times)


def _gloo_worker(rank: int, size_bytes: int, reps: int, port: int, out) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    seconds = gloo_broadcast_seconds(rank, 2, size_bytes, reps)
    if rank == 1:
        out.put(seconds)


def gloo_seconds(size_bytes: int, reps: int) -> float:
    ctx = mp.get_context("spawn")
    queue = ctx.Queue()
    port = 29500 + os.getpid() % 1000
    procs = [ctx.Process(target=_gloo_worker, args=(r, size_bytes, reps, port, queue)) for r in range(2)]
    for p in procs:
        p.start()
    result = queue.get(timeout=600)
    for p in procs:
        p.join()
    return result


def memcpy_seconds(size_bytes: int, reps: int) -> float:
    src, dst = torch.ones(size_bytes // 4), torch.zeros(size_bytes // 4)
    dst.copy_(src)
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        dst.copy_(src)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def mesh_seconds(size_bytes: int, reps: int) -> dict[str, float]:
    pub_procs = this_host().spawn_procs(per_host={"procs": 1}, name="publisher")
    rec_procs = this_host().spawn_procs(per_host={"procs": 1}, name="receiver")
    try:
        publisher = pub_procs.spawn("publisher", Publisher, size_bytes)
        receiver = rec_procs.spawn("receiver", Receiver, size_bytes)
        manifest = wait(publisher.manifest.call_one())
        chosen = {t: wait(receiver.attach.call_one(manifest, t)) for t in ("auto", "rdma")}
        grouped = dataclasses.replace(manifest, group=wait(publisher.group.call_one()))
        joined, attached = publisher.join.call_one(), receiver.attach.call_one(grouped, "group")
        chosen["group"], _ = wait(attached), wait(joined)
        out = {}
        for transport in ("auto", "rdma", "group"):
            times = []
            for _ in range(reps + 1):  # the first refresh warms up
                version = wait(publisher.step.call_one())
                times.append(wait(receiver.refresh.call_one(transport, version)))
            out[f"forge_nb ({transport}->{chosen[transport]})"] = statistics.median(times[1:])
        raw = wait(publisher.raw_buffer.call_one())
        wait(receiver.raw_read.call_one(raw))
        out["raw RDMABuffer"] = statistics.median(wait(receiver.raw_read.call_one(raw)) for _ in range(reps))
        wait(publisher.unlink.call_one())
        return out
    finally:
        wait(pub_procs.stop())
        wait(rec_procs.stop())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes-mb", type=int, nargs="+", default=[16, 256, 1024])
    parser.add_argument("--hosts", action="store_true", help="across network-namespace hosts (needs root)")
    parser.add_argument("--fanout", type=int, nargs="+", default=[1, 2, 4], help="generator hosts (--hosts)")
    parser.add_argument("--reps", type=int, default=0, help="refreshes timed per size (--hosts; 0: 5 / 3 / 2 by size)")
    parser.add_argument("--streams", type=int, default=4, help="TCP streams per generator (--hosts; weights.streams)")
    parser.add_argument("--lora", metavar="MODEL", default="", help="a model's full vs LoRA adapter refresh")
    parser.add_argument("--engines", nargs="+", default=["torch"], help="with --lora: torch and/or vllm")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--refreshes", type=int, default=4)
    parser.add_argument("--sharded", action="store_true", help="2 trainer ranks: shard-direct vs gather to rank 0")
    parser.add_argument("--where", nargs="+", default=["host", "hosts"], help="with --sharded: host and/or hosts")
    args = parser.parse_args()
    if args.sharded:
        from weight_refresh_sharded import run as sharded

        sizes = [mb for mb in args.sizes_mb if mb >= 256] or args.sizes_mb
        return sharded(sizes, args.reps or 3, args.where)
    if args.hosts:
        from weight_refresh_hosts import run

        return run(args.sizes_mb, args.fanout, args.reps, args.streams)
    if args.lora:
        from weight_refresh_lora import lora_table

        return lora_table(args.lora, args.engines, args.rank, args.refreshes)
    rows = []
    for mb in args.sizes_mb:
        size = mb << 20
        reps = 5 if mb <= 64 else 3 if mb <= 256 else 2
        seconds = mesh_seconds(size, reps)
        seconds["gloo broadcast"] = gloo_seconds(size, reps)
        seconds["memcpy"] = memcpy_seconds(size, reps)
        rows.append((mb, {k: size / v / 1e9 for k, v in seconds.items()}))
        print(f"measured {mb} MB", flush=True)
    methods = list(rows[0][1])
    print(f"\nweight refresh GB/s (median), 1 torch thread per process, {os.cpu_count()} cores\n")
    print(f"{'size':>8}" + "".join(f"{m:>26}" for m in methods) + f"{'forge_nb/gloo':>15}")
    for mb, gbps in rows:
        ratio = gbps[methods[0]] / gbps["gloo broadcast"]
        print(f"{mb:>6}MB" + "".join(f"{gbps[m]:>26.3f}" for m in methods) + f"{ratio:>14.2f}x")
    print("\ngoal: forge_nb >= 1.0x gloo from 256 MB up")


if __name__ == "__main__":
    main()
