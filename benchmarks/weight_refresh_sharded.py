"""Refresh from a sharded trainer (`weight_refresh.py --sharded`): 2 trainer ranks -> 2 generators, one run,
side by side, on one host (/dev/shm) and across network-namespace hosts (root; TCP streams, a host each):

shard-direct       forge_nb: each rank publishes its own half of every tensor into its own double buffer;
                   each generator reads both ranks at once (both trainer links carry half the bytes) and
                   puts the whole tensors together (`weights.shards`)
gather to rank 0   the peers' pattern (verl, TRL, OpenRLHF, AReaL, SkyRL): the ranks all-gather every tensor
                   (gloo over the same links), rank 0 publishes the whole model, each generator reads it all
                   from rank 0; the same publisher, receiver and transport as forge_nb's, so only the
                   pattern differs

Seconds: from the trainer's step (publish; the gather included) until both generators have loaded, median of
`--reps` after a warm-up. Trainer memory: the extra bytes a rank holds for a refresh (the double buffer, and
for the gather the whole model each rank gathers), from the tensors' sizes.

    python benchmarks/weight_refresh.py --sharded [--sizes-mb 256 1024] [--reps 3] [--where host hosts]
"""

from __future__ import annotations

import dataclasses
import json
import os
import secrets
import shutil
import statistics
import subprocess
import sys
import time

import torch
import torch.distributed as dist
from monarch.actor import Actor, endpoint, this_host

from forge_nb.launch.torchrun import start_gang
from forge_nb.runtime.calls import wait
from forge_nb.weights.publish import WeightPublisher
from forge_nb.weights.refresh import WeightReceiver

HERE = os.path.dirname(os.path.abspath(__file__))
# Local procs import this module's actors (as the hosts' procs do through weight_refresh_hosts._env).
os.environ["PYTHONPATH"] = os.pathsep.join(filter(None, [os.path.dirname(HERE), HERE, os.environ.get("PYTHONPATH")]))

TENSORS = 8  # the "model" is this many equal fp32 tensors, [rows, 1024] each
SECRET = secrets.token_bytes(32)  # the streams' secret, as a session's (procs get this process's as an argument)
COLS = 1024


def _rows(size_bytes: int) -> int:
    return size_bytes // 4 // TENSORS // COLS


class TrainerRank(Actor):
    """One of 2 trainer ranks: its half of each tensor (rows split as FSDP2 splits dim 0), a shard-direct
    publisher, and on rank 0 a whole-model publisher for the gather pattern; each serves its TCP streams at its
    host's address in `hosts` (by rank) to readers that prove `secret`, as a session's trainer does."""

    def __init__(self, size_bytes: int, secret: bytes = SECRET, hosts: tuple[str, ...] = ()) -> None:
        torch.set_num_threads(1)
        dist.init_process_group("gloo")
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        rows = _rows(size_bytes)
        share = -(-rows // self.world)
        start = self.rank * share
        self.shards = [(f"layer{i}.weight", torch.full((min(share, rows - start), COLS), 1.0)) for i in range(TENSORS)]
        spans = {name: (start, rows) for name, _ in self.shards}
        streams = {"stream_secret": secret, "stream_host": hosts[self.rank] if hosts else "127.0.0.1"}
        self.sharded = WeightPublisher(self.shards, 0, rows=spans, rank=self.rank, ranks=self.world, **streams)
        self.whole_rows = rows
        whole = [(name, torch.empty(rows, COLS)) for name, _ in self.shards]
        self.gathered = WeightPublisher(whole, 0, **streams) if self.rank == 0 else None
        self.version = 0

    @endpoint
    def manifests(self):
        return self.sharded.manifest(), self.gathered.manifest() if self.gathered is not None else None

    @endpoint
    def step_sharded(self) -> int:
        self.version += 1
        self.sharded.publish(self.shards, self.version)
        return self.version

    @endpoint
    def step_gathered(self) -> int:
        """All-gather every tensor (each rank ends up with the whole model, as `DTensor.full_tensor()`
        does), rank 0 publishes it."""
        self.version += 1
        whole = []
        for name, shard in self.shards:
            parts = [torch.empty_like(shard) for _ in range(self.world)]
            dist.all_gather(parts, shard)
            whole.append((name, torch.cat(parts)[: self.whole_rows]))
        if self.gathered is not None:
            self.gathered.publish(whole, self.version)
        return self.version

    @endpoint
    def extra_bytes(self) -> dict[str, int]:
        """Bytes this rank holds for refreshes: its double buffer(s), and for the gather its gathered copy."""
        shard = sum(t.nbytes for _, t in self.shards)
        whole = sum(t.nbytes for _, t in self.shards) * self.world
        gathered = whole + (2 * self.gathered.nbytes if self.gathered is not None else 0)
        return {"shard-direct": 2 * self.sharded.nbytes, "gather to rank 0": gathered, "shard": shard}

    @endpoint
    def unlink(self) -> None:
        self.sharded.unlink()
        if self.gathered is not None:
            self.gathered.unlink()


class Generator(Actor):
    """A generator's receivers: from both ranks' shards, and from rank 0's whole model."""

    def __init__(self, size_bytes: int) -> None:
        torch.set_num_threads(1)
        self.params = {f"layer{i}.weight": torch.zeros(_rows(size_bytes), COLS) for i in range(TENSORS)}

    def _load(self, named) -> None:
        for name, t in named:
            self.params[name].copy_(t)

    @endpoint
    async def attach(self, sharded: list, gathered, transport: str) -> str:
        self.receivers = {
            "shard-direct": WeightReceiver(sharded, 0, transport),
            "gather to rank 0": WeightReceiver(gathered, 0, transport),
        }
        return self.receivers["shard-direct"].transport

    @endpoint
    async def refresh(self, pattern: str, version: int) -> float:
        report = await self.receivers[pattern].refresh(version, self._load)
        return report.seconds


def seconds(trainer, generators: list, size_bytes: int, reps: int, transport: str) -> dict[str, float]:
    """Median seconds from the trainer's step to both generators loaded, for each pattern."""
    pairs = list(wait(trainer.manifests.call()).values())
    sharded = [p[0] for p in pairs]
    gathered = next(p[1] for p in pairs if p[1] is not None)
    if transport == "tcp":

        def read(m):  # 4 streams, and the secret the session would give
            return dataclasses.replace(m, stream=dataclasses.replace(m.stream, streams=4, secret=SECRET))

        sharded, gathered = [read(m) for m in sharded], read(gathered)
    for g in generators:
        assert wait(g.attach.call_one(sharded, gathered, transport)) == transport
    wait(trainer.unlink.call())
    out = {}
    for pattern, step in (("shard-direct", "step_sharded"), ("gather to rank 0", "step_gathered")):
        times = []
        for _ in range(reps + 1):  # the first warms up
            start = time.perf_counter()
            version = list(wait(getattr(trainer, step).call()).values())[0]
            for f in [g.refresh.call_one(pattern, version) for g in generators]:
                wait(f)
            times.append(time.perf_counter() - start)
        out[pattern] = statistics.median(times[1:])
    memory = list(wait(trainer.extra_bytes.call()).values())
    out["memory"] = {k: max(m[k] for m in memory) for k in memory[0]}
    return out


def on_one_host(size_bytes: int, reps: int) -> dict:
    trainer_procs = this_host().spawn_procs(per_host={"procs": 2}, name="trainer")
    generator_procs = this_host().spawn_procs(per_host={"procs": 2}, name="generator")
    try:
        start_gang(trainer_procs, "127.0.0.1")
        trainer = trainer_procs.spawn("trainer", TrainerRank, size_bytes, SECRET)  # a proc's own SECRET differs
        generators = [generator_procs.spawn("generator", Generator, size_bytes).slice(procs=i) for i in range(2)]
        return seconds(trainer, generators, size_bytes, reps, "shm")
    finally:
        wait(trainer_procs.stop())
        wait(generator_procs.stop())


def across_hosts(sizes_mb: list[int], reps: int) -> dict[int, dict]:
    """Trainer ranks on hosts 1 and 2, generators on hosts 3 and 4 (each host a namespace with its own link)."""
    import tempfile

    from monarch.actor import attach_to_workers, enable_transport
    from weight_refresh_hosts import PORT, _env

    from forge_nb.launch.credentials import Credentials
    from forge_nb.testing.netns_hosts import HostNet

    net = HostNet(4, "shard").up()
    credentials = Credentials.new(os.path.join(tempfile.mkdtemp(), "credentials"))
    workers = [
        subprocess.Popen(h.worker_args(PORT, str(credentials.folder)), env=_env(), stdout=subprocess.DEVNULL)
        for h in net.hosts
    ]
    try:
        credentials.use(net.gateway)
        enable_transport(f"tls://{net.gateway}:0")
        hosts = attach_to_workers(ca="trust_all_connections", workers=[f"tls://{h.ip}:{PORT}" for h in net.hosts])
        out = {}
        for mb in sizes_mb:
            trainer_procs = hosts.slice(hosts=slice(0, 2)).spawn_procs(per_host={"procs": 1}, name="trainer")
            generator_procs = [hosts.slice(hosts=i).spawn_procs(per_host={"procs": 1}, name=f"gen{i}") for i in (2, 3)]
            try:
                start_gang(trainer_procs, net.hosts[0].ip)
                ranks_at = (net.hosts[0].ip, net.hosts[1].ip)
                trainer = trainer_procs.spawn("trainer", TrainerRank, mb << 20, SECRET, ranks_at)
                generators = [p.spawn("generator", Generator, mb << 20) for p in generator_procs]
                out[mb] = seconds(trainer, generators, mb << 20, reps, "tcp")
            finally:
                wait(trainer_procs.stop())
                for p in generator_procs:
                    wait(p.stop())
            print(f"measured {mb} MB across hosts", flush=True)
        return out
    finally:
        for w in workers:
            w.kill()
            w.wait()
        net.down()
        shutil.rmtree(credentials.folder.parent, ignore_errors=True)


def across_hosts_in_a_child(sizes_mb: list[int], reps: int) -> dict[int, dict]:
    """`across_hosts` in a fresh process: Monarch fixes a process's transport at its first call, and this
    one's local procs already use Unix sockets, while the hosts need TCP."""
    args = [sys.executable, __file__, "--across-hosts", str(reps), *map(str, sizes_mb)]
    done = subprocess.run(args, stdout=subprocess.PIPE, text=True, check=True)
    print(done.stdout.rsplit("\n", 2)[0], flush=True)
    return {int(mb): r for mb, r in json.loads(done.stdout.strip().splitlines()[-1]).items()}


def run(sizes_mb: list[int], reps: int, where: list[str]) -> None:
    results = {}
    if "host" in where:
        for mb in sizes_mb:
            results[("one host (shm)", mb)] = on_one_host(mb << 20, reps)
            print(f"measured {mb} MB on one host", flush=True)
    if "hosts" in where:
        for mb, r in across_hosts_in_a_child(sizes_mb, reps).items():
            results[("4 namespace hosts (tcp)", mb)] = r
    print(
        f"\nrefresh from 2 trainer ranks to 2 generators: seconds from the step until both generators loaded "
        f"(median of {reps}), {os.cpu_count()} cores\n"
    )
    head = f"{'where':>24} {'size':>7} {'shard-direct s':>15} {'gather s':>9} {'speed-up':>9}"
    print(head + f" {'trainer extra MB: shard-direct':>31} {'gather':>7}")
    for (label, mb), r in results.items():
        m = r["memory"]
        print(
            f"{label:>24} {mb:>5}MB {r['shard-direct']:>15.3f} {r['gather to rank 0']:>9.3f} "
            f"{r['gather to rank 0'] / r['shard-direct']:>8.2f}x {m['shard-direct'] / 1e6:>31.0f} "
            f"{m['gather to rank 0'] / 1e6:>7.0f}"
        )
    print("\ngoal: shard-direct >= 1.5x the gather at 1 GB across hosts")


if __name__ == "__main__":  # the child of across_hosts_in_a_child: its results as JSON on the last line
    assert sys.argv[1] == "--across-hosts"
    print(json.dumps(across_hosts([int(mb) for mb in sys.argv[3:]], int(sys.argv[2]))))
