"""Session start and stop: procs forked from the fork server against procs started as fresh interpreters.

Both sides run the same session of the bundled model (generator, trainer, reward worker, checker; the
torch engine), `up()`, `--steps` synchronous steps, `down()`, in one process that ran a session before
(as a kernel does its second `%forge up`, or a test worker its next test). The only difference is
``FORGE_NB_FORK_PROCS`` (1: `forge_nb.mesh.forkserver`, 0: each proc imports torch and transformers
itself). Sessions alternate between the two so machine noise hits both alike. "CPU" is the whole
machine's busy time (/proc/stat) from before `up()` to after `down()`: every proc of the session,
the server included, and anything else running then (run it on an idle machine).

    python benchmarks/session_start.py [--sessions 5] [--steps 2]
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import forge_nb

SIDES = {"forked": "1", "fresh": "0"}
SESSION = dict(prompts_per_step=4, group_size=4, engine="torch")


def busy_s() -> float:
    """CPU seconds the machine has been busy (all cores, user + system + irq), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def one_session(fork: str, steps: int) -> dict[str, float]:
    """up, `steps` steps, down with ``FORGE_NB_FORK_PROCS=fork`` -> seconds of each, and the machine's CPU."""
    os.environ["FORGE_NB_FORK_PROCS"] = fork
    cpu0, t0 = busy_s(), time.perf_counter()
    session = forge_nb.up(**SESSION)
    t1 = time.perf_counter()
    session.step(steps)
    t2 = time.perf_counter()
    session.down()
    t3 = time.perf_counter()
    return {"up": t1 - t0, "steps": t2 - t1, "down": t3 - t2, "cpu": busy_s() - cpu0}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per side")
    parser.add_argument("--steps", type=int, default=2)
    args = parser.parse_args()
    one_session("1", 1)  # warm-up: this process imports what a kernel has imported after its first session
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for _ in range(args.sessions):
        for side, fork in SIDES.items():
            runs[side].append(one_session(fork, args.steps))
    print(f"\nsession of the bundled model, up + {args.steps} steps + down; n = {args.sessions} sessions a side")
    print(f"{'seconds':<8}" + "".join(f"{side + ' (mean ± sd)':>22}" for side in SIDES) + f"{'fresh / forked':>16}")
    for what in ("up", "steps", "down", "cpu"):
        cells, means = "", []
        for side in SIDES:
            values = [r[what] for r in runs[side]]
            means.append(statistics.mean(values))
            cells += f"{means[-1]:>13.2f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:<6.2f}"
        print(f"{what:<8}{cells}{means[1] / means[0]:>15.2f}x")
    os.environ.pop("FORGE_NB_FORK_PROCS")


if __name__ == "__main__":
    main()
