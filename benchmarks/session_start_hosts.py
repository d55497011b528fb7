"""Session start and stop on a mesh over hosts' workers: procs started fresh by each worker against procs
forked from the worker's own fork server (`forge_nb.launch.forks.on_workers`), which lives as long as the worker.

Three workers (``python -m forge_nb.launch.worker``, holding a CA made for the run) on this machine's loopback, at
three ports, stand in for three hosts (the network between them is not what is measured). Every session is the
same: the bundled model, the trainer a gang of 2 procs on the first host, the generator on the second, the reward
worker and the checker on the third (`mesh.kind="hosts"`, as tests/launch/test_hosts.py), `up()`, `--steps` synchronous
steps, `down()`, all in this process (a hosts session must be its process's first Monarch use). Only
``FORGE_NB_FORK_PROCS`` differs: "fresh" 0 (each proc imports torch and transformers itself), "forked" the
default. The first forked session starts each worker's server (shown alone, "forked, first"); the next ones
find it, as a notebook's next `%forge up` on the same workers does. "fresh" and "forked" sessions alternate.
"cpu" is the whole machine's busy time from before `up()` to after `down()` (run it on an idle machine).

    python benchmarks/session_start_hosts.py [--sessions 5] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from session_start import timed_session

from forge_nb.launch.credentials import Credentials
from forge_nb.launch.hosts import answers

PORTS = (29811, 29812, 29813)
SESSION = {"mesh.kind": "hosts", "trainer_procs": 2, "prompts_per_step": 4, "group_size": 4, "engine": "torch"}


def start_workers(credentials: str) -> list[subprocess.Popen]:
    """One worker per port holding `credentials`, each answering before this returns."""
    worker = [sys.executable, "-m", "forge_nb.launch.worker"]
    workers = [subprocess.Popen([*worker, f"tls://127.0.0.1:{port}", "--credentials", credentials]) for port in PORTS]
    deadline = time.monotonic() + 60
    while not all(answers("127.0.0.1", port, 0.5) for port in PORTS):
        if time.monotonic() > deadline:
            raise RuntimeError("the workers did not start in 60 s")
        time.sleep(0.2)
    return workers


def one_session(fork: str, steps: int, credentials: str) -> dict[str, float]:
    """up, `steps` steps, down with ``FORGE_NB_FORK_PROCS=fork`` -> seconds of each, and the machine's CPU."""
    os.environ["FORGE_NB_FORK_PROCS"] = fork
    hosts = {"mesh.hosts": [f"tls://127.0.0.1:{port}" for port in PORTS], "mesh.credentials": credentials}
    return timed_session(steps, **SESSION, **hosts)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per side")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    folder = tempfile.mkdtemp()
    credentials = str(Credentials.new(os.path.join(folder, "credentials")).folder)
    workers = start_workers(credentials)
    try:
        one_session("0", 1, credentials)  # warm-up: this process imports what a kernel has after its first session
        runs: dict[str, list[dict[str, float]]] = {"fresh": [], "forked, first": [], "forked": []}
        runs["forked, first"].append(one_session("1", args.steps, credentials))  # starts each worker's server
        for _ in range(args.sessions):
            runs["fresh"].append(one_session("0", args.steps, credentials))
            runs["forked"].append(one_session("1", args.steps, credentials))
    finally:
        for w in workers:
            w.terminate()
            w.wait()
        os.environ.pop("FORGE_NB_FORK_PROCS", None)
        shutil.rmtree(folder, ignore_errors=True)
    print(f"\nsession of the bundled model over 3 workers, up + {args.steps} steps + down; n = {args.sessions} a side")
    header = f"{'fresh (mean ± sd)':>24}{'forked, first':>15}{'forked (mean ± sd)':>24}{'fresh / forked':>16}"
    print(f"{'seconds':<8}{header}")
    for what in ("up", "steps", "down", "cpu"):
        fresh, forked = ([r[what] for r in runs[side]] for side in ("fresh", "forked"))
        cells = f"{statistics.mean(fresh):>15.2f} ± {statistics.stdev(fresh) if len(fresh) > 1 else 0.0:<6.2f}"
        cells += f"{runs['forked, first'][0][what]:>15.2f}"
        cells += f"{statistics.mean(forked):>15.2f} ± {statistics.stdev(forked) if len(forked) > 1 else 0.0:<6.2f}"
        print(f"{what:<8}{cells}{statistics.mean(fresh) / statistics.mean(forked):>15.2f}x")


if __name__ == "__main__":
    main()
