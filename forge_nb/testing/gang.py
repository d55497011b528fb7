"""Run a function on N processes of this host in one torch.distributed group, without a mesh: for
scripts, benchmarks and tests that drive `parallel.Policy` directly (a session sets its gang up through
Monarch: `forge_nb.launch.torchrun`). Each process gets torchrun's variables and one torch thread.

Each rank is a proc of this process's fork server (`launch.forks.server`, as a session's procs are: torch,
transformers and the `Policy` already imported; with ``FORGE_NB_FORK_LINGER_S`` the same server serves every
gang and session of the process), or a fresh interpreter where procs do not fork (``FORGE_NB_FORK_PROCS=0``,
not Linux). The function travels pickled (by reference: a module-level function, of a module or of the script
that runs, as multiprocessing's spawn takes it), with this process's ``sys.path``."""

from __future__ import annotations

import os
import pickle
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch

from forge_nb.launch.forks import server as forkserver
from forge_nb.launch.shared_cores import proc_env
from forge_nb.parallel.gang import free_port

JOB_ENV = "FORGE_NB_GANG_JOB"


def run_gang(world: int, fn: Callable[..., Any], *args: Any, timeout: float = 600.0, threads: int = 1) -> list:
    """`fn(rank, world, *args)` in `world` processes (`fn` a module-level function) -> each rank's return value,
    in rank order. Ranks still running after `timeout` s are killed."""
    with tempfile.TemporaryDirectory() as out:
        job = Path(out) / "job.pkl"
        job.write_bytes(pickle.dumps(_job(fn, args, threads, out)))
        forks = _fork_server()
        env = {
            **os.environ,
            **proc_env(),
            JOB_ENV: str(job),
            "MASTER_ADDR": "127.0.0.1",
            "MASTER_PORT": str(free_port()),
        }
        procs = [
            _start(forks, {**env, "RANK": str(r), "WORLD_SIZE": str(world), "LOCAL_RANK": str(r)}) for r in range(world)
        ]
        try:
            codes = [_wait(p, timeout) for p in procs]
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()  # (a forked rank's lifeline ends it with its client)
                    p.wait()
            if forks is not None:
                forkserver.release(forks)
        if codes != [0] * world:
            raise RuntimeError(f"gang ranks exited with {codes}")
        return [torch.load(Path(out) / f"rank{r}.pt", weights_only=False) for r in range(world)]


def _job(fn: Callable, args: tuple, threads: int, out: str) -> dict:
    """What a rank needs: this process's import path and main script (for a function defined there), then the
    call itself, pickled apart (it can be unpickled only once the path is in place)."""
    main = sys.modules["__main__"]
    main_path = getattr(main, "__file__", None) if getattr(fn, "__module__", None) == "__main__" else None
    return {"path": list(sys.path), "main": main_path, "call": pickle.dumps((fn, args)), "threads": threads, "out": out}


def _fork_server() -> forkserver.ForkServer | None:
    if not forkserver.forks_here():
        return None
    forks = forkserver.acquire(proc_env())  # its imports see what the ranks get
    if not forks.wait_ready():
        forks.stop()
        return None
    return forks


def _start(forks: forkserver.ForkServer | None, env: dict[str, str]) -> subprocess.Popen:
    module = "forge_nb.testing.gang"
    args = ["-m", "forge_nb.launch.forks.client", forks.path, module] if forks is not None else ["-m", module]
    return subprocess.Popen([sys.executable, *args], env=env)


def _wait(proc: subprocess.Popen, timeout: float) -> int | None:
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        return None


def _rank_main() -> None:
    """A rank (``python -m forge_nb.testing.gang``, forked or fresh): the job named by ``FORGE_NB_GANG_JOB``."""
    job = pickle.loads(Path(os.environ[JOB_ENV]).read_bytes())
    sys.path[:] = job["path"]
    if job["main"] is not None:
        import multiprocessing.spawn

        multiprocessing.spawn.import_main_path(job["main"])  # as spawn does: `__main__`'s functions resolve
    fn, args = pickle.loads(job["call"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.set_num_threads(job["threads"])
    result = fn(rank, world, *args)
    torch.save(result, Path(job["out"]) / f"rank{rank}.pt")
    import torch.distributed as dist

    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    _rank_main()
