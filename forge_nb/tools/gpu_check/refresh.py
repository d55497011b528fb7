"""The refresh part of `make gpu-check`: the trainer's weights into a generator in another process, through
the product's `weights.publish.WeightPublisher` and `weights.refresh.WeightReceiver`, over CUDA IPC (GPU
snapshots, device-to-device copies) against the host-staged path (/dev/shm snapshots, copied into host
memory and loaded from there), each after a real optimizer step; then a refresh overlapping the trainer's
next step (the double buffer allows it: the reader copies version v while the trainer computes v + 1).

Both paths move the same bytes (every parameter in bfloat16, the usual serving dtype) into the same
engine (`engines.TorchEngine` on the GPU); each refresh ends with the engine serving the version, and
the served weights' checksum is compared with the trainer's after the last refresh of each path.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from forge_nb.config import TrainerConfig
from forge_nb.engines import weights_bytes
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.policy import Policy, PolicySpec
from forge_nb.tools.gpu_check.parts import grpo_step
from forge_nb.tools.gpu_check.table import Row, grpo_batch, sync
from forge_nb.weights.manifest import checksum
from forge_nb.weights.publish import WeightPublisher

SERVE = torch.bfloat16


def receive(model_dir: str, device: str, manifests: dict[str, Any], requests, answers) -> None:
    """The generator process: an engine on the GPU and one receiver per transport; answers each request
    ``(transport, version)`` with (seconds, transfer seconds, bytes), ``("checksum", None)`` with the served
    weights' checksum, None ends it."""
    from forge_nb.engines.torch_engine import TorchEngine
    from forge_nb.weights.refresh import WeightReceiver

    engine = TorchEngine.load(model_dir, SERVE, device)
    receivers = {name: WeightReceiver(m, 0, name, engine.device) for name, m in manifests.items()}
    answers.put({name: r.transport for name, r in receivers.items()})
    while (request := requests.get()) is not None:
        kind, version = request
        if kind == "checksum":
            answers.put(checksum(engine.named_weights()))
            continue
        report = asyncio.run(receivers[kind].refresh(version, engine.load_weights))
        sync()
        answers.put((report.seconds, report.transfer_seconds, report.bytes))


def refresh_rows(model_dir: str, args: argparse.Namespace) -> list[Row]:
    """Refreshes over both paths, `args.reps` each, and the overlap with a step (module docstring)."""
    policy = Policy(PolicySpec(model_dir, "float32", args.device, 0, 1.0, TrainerConfig(), False, 1e-6), Gang())
    batch = grpo_batch(args.prompts, args.group, args.prompt_len, args.completion_len, args.vocab)
    step = grpo_step(policy, batch, args.completion_len)
    named = policy.published()
    publishers = {"shm": WeightPublisher(named, 0, SERVE)}
    if policy.device.type == "cuda":  # first: the table's first refresh row
        publishers = {"cuda_ipc": WeightPublisher(named, 0, SERVE, device=policy.device, host=False), **publishers}
    context = torch.multiprocessing.get_context("spawn")
    requests, answers = context.Queue(), context.Queue()
    manifests = {name: p.manifest(rdma=False) for name, p in publishers.items()}
    child = context.Process(target=receive, args=(model_dir, args.device, manifests, requests, answers), daemon=True)
    child.start()
    try:
        chosen = answers.get(timeout=600)
        assert chosen == {name: name for name in publishers}, f"the generator chose {chosen}"
        timings, sums = _refreshes(policy, publishers, step, requests, answers, args.reps)
        trainer_sum = checksum((n, t.to(SERVE)) for n, t in policy.published())
        rows = _rows(timings, sums, trainer_sum)
        first = next(iter(publishers))
        rows += _overlap(policy, first, publishers[first], step, requests, answers, args.reps + 1)
    finally:
        requests.put(None)
        child.join(timeout=60)
        if child.is_alive():
            child.kill()
    return rows


def _refreshes(policy, publishers, step, requests, answers, reps: int) -> tuple[dict, dict]:
    """`reps` x (a step, both publishers publish it, the generator loads it over each) -> per path the
    timings [(publish s, refresh s, transfer s, bytes)] and the served checksum after its last refresh."""
    timings: dict[str, list] = {name: [] for name in publishers}
    sums = {}
    for version in range(1, reps + 1):
        step()
        for name, publisher in publishers.items():
            start = time.perf_counter()
            publisher.publish(policy.published(), version)
            published = time.perf_counter() - start
            requests.put((name, version))
            timings[name].append((published, *answers.get(timeout=600)))
            if version == reps:
                requests.put(("checksum", None))
                sums[name] = answers.get(timeout=600)
    return timings, sums


def _rows(timings: dict, sums: dict, trainer_sum: str) -> list[Row]:
    rows, seconds = [], {}
    for name, runs in timings.items():
        publish = statistics.median(r[0] for r in runs)
        refresh = statistics.median(r[1] for r in runs)
        transfer = statistics.median(r[2] for r in runs)
        nbytes = runs[0][3]
        seconds[name] = refresh
        same = "served == trainer's" if sums[name] == trainer_sum else f"served {sums[name]} != trainer {trainer_sum}"
        what = {"cuda_ipc": "CUDA IPC (GPU snapshots)", "shm": "host-staged (/dev/shm)"}[name]
        check = f"{nbytes / 1e9:.2f} GB, publish {publish * 1e3:.1f} ms, copy {transfer * 1e3:.1f} ms; {same}"
        rows.append(Row("refresh", what, refresh, nbytes / refresh / 1e9, "GB/s", float("nan"), check))
    if "cuda_ipc" in seconds:
        rows[0].check += f"; {seconds['shm'] / seconds['cuda_ipc']:.1f}x host-staged"
    return rows


def _overlap(policy, name: str, publisher, step, requests, answers, version: int) -> list[Row]:
    """A step alone, then a step while the generator copies and loads the previous version over `name`."""
    start = time.perf_counter()
    step()
    sync()
    alone = time.perf_counter() - start
    publisher.publish(policy.published(), version)
    start = time.perf_counter()
    requests.put((name, version))
    step()
    sync()
    during = time.perf_counter() - start
    refresh = answers.get(timeout=600)[0]
    check = f"step alone {alone:.3f} s, with the refresh beside it {during:.3f} s ({during / alone:.2f}x)"
    return [Row("overlap", f"{name} refresh v during step v+1", refresh, float("nan"), "", float("nan"), check)]


def nccl_rows(model_dir: str, args: argparse.Namespace) -> list[Row]:
    """The "group" transport's NCCL group (`weights.group.open_group`) as far as one GPU allows: a group of
    one member built and broadcasting the trainer-sized snapshot (NCCL needs a GPU per member)."""
    from forge_nb.weights.group import GroupEnd, group_spec

    if args.device != "cuda":
        return []
    snapshot = torch.ones(int(weights_bytes(Path(model_dir)) / 2), dtype=torch.uint8, device="cuda")
    end = GroupEnd(group_spec(("127.0.0.1",), 1, "nccl", 60.0), 0)
    end.broadcast(snapshot)
    sync()
    start = time.perf_counter()
    end.broadcast(snapshot)
    sync()
    seconds = time.perf_counter() - start
    check = f"a group of one built, {snapshot.numel() / 1e9:.2f} GB broadcast: no bytes move (a GPU per member)"
    return [Row("group", "NCCL group of one", seconds, float("nan"), "", float("nan"), check)]
