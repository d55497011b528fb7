"""Run a function on N processes of this host in one torch.distributed group, without a mesh: for
scripts, benchmarks and tests that drive `parallel.Policy` directly (a session sets its gang up through
Monarch: `forge_nb.launch.torchrun`). Each process gets torchrun's variables and one torch thread."""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.multiprocessing as mp

from forge_nb.parallel.gang import free_port


def run_gang(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 600.0, threads: int = 1) -> list:
    """`fn(rank, world, *args)` in `world` fresh processes (a module-level function: they are spawned)
    -> each rank's return value, in rank order. Ranks still running after `timeout` s are killed."""
    from multiprocessing import resource_tracker

    tracker_was_running = resource_tracker._resource_tracker._fd is not None
    try:
        return _run(world, fn, args, timeout, threads)
    finally:
        if not tracker_was_running:  # spawning started multiprocessing's tracker process: leave none behind
            resource_tracker._resource_tracker._stop()


def _run(world: int, fn: Callable[..., Any], args: tuple, timeout: float, threads: int) -> list:
    with tempfile.TemporaryDirectory() as out:
        ctx = mp.get_context("spawn")
        port = free_port()
        procs = [ctx.Process(target=_entry, args=(r, world, port, threads, out, fn, args)) for r in range(world)]
        for p in procs:
            p.start()
        try:
            for p in procs:
                p.join(timeout)
        finally:
            for p in procs:
                if p.is_alive():
                    p.kill()
                    p.join()
        codes = [p.exitcode for p in procs]
        if codes != [0] * world:
            raise RuntimeError(f"gang ranks exited with {codes}")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _entry(rank: int, world: int, port: int, threads: int, out: str, fn: Callable, args: tuple) -> None:
    os.environ.update(RANK=str(rank), WORLD_SIZE=str(world), LOCAL_RANK=str(rank))
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(threads)
    result = fn(rank, world, *args)
    torch.save(result, Path(out) / f"rank{rank}.pt")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()
