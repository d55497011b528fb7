"""Session start and stop: procs started as fresh interpreters, forked from a fork server, and forked from
a server that lingered from the session before.

Every side runs the same session of the bundled model (generator, trainer, reward worker, checker; the
torch engine), `up()`, `--steps` synchronous steps, `down()`, in one process that ran a session before
(as a kernel does its second `%forge up`, or a test worker its next test). Only the environment differs:
"fresh" ``FORGE_NB_FORK_PROCS=0`` (each proc imports torch and transformers itself), "forked" the default
(`forge_nb.launch.forks.server`, one server a session, stopped at down), "lingering" with
``FORGE_NB_FORK_LINGER_S=600`` (the server of the session before serves this one). "fresh" and "forked"
sessions alternate so machine noise hits both alike; the lingering sessions run after them, as a block (a
forked session would take the lingering server), after one that starts the server and is not counted.
"cpu" is the whole machine's busy time (/proc/stat) from before `up()` to after `down()`: every proc of the
session, the server included, and anything else running then (run it on an idle machine).

    python benchmarks/session_start.py [--sessions 5] [--steps 2]

``--server``: sessions as a notebook or script starts them, `forge_nb.up()` (each its own session server), three
sides in turn. "own interpreter" ``FORGE_NB_ZYGOTE=0 FORGE_NB_FORK_PREFORK=0``: the server starts afresh and its
mesh starts a fork server that imports torch and transformers again. "forked from the server"
``FORGE_NB_ZYGOTE=0``: the server starts afresh and forks its fork server from itself (`forge_nb.launch.forks.early`).
"from a zygote", the default: the server is forked from the zygote (`forge_nb.server.zygote`) that a first session,
not counted, started; its imports are done.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

from forge_nb.session import Session

SIDES = {"fresh": ("0", "0"), "forked": ("1", "0"), "lingering": ("1", "600")}  # FORK_PROCS, FORK_LINGER_S
SESSION = dict(prompts_per_step=4, group_size=4, engine="torch")


def busy_s() -> float:
    """CPU seconds the machine has been busy (all cores, user + system + irq), from /proc/stat."""
    with open("/proc/stat") as f:
        ticks = [int(x) for x in f.readline().split()[1:]]
    return (sum(ticks) - ticks[3] - ticks[4]) / os.sysconf("SC_CLK_TCK")  # less idle and iowait


def one_session(side: tuple[str, str], steps: int) -> dict[str, float]:
    """up, `steps` steps, down on `side` (its two variables) -> seconds of each, and the machine's CPU."""
    os.environ["FORGE_NB_FORK_PROCS"], os.environ["FORGE_NB_FORK_LINGER_S"] = side
    return timed_session(steps, **SESSION)


def timed_session(steps: int, **options) -> dict[str, float]:
    """`Session.up(**options)`, `steps` steps, down -> seconds of each, and the machine's CPU meanwhile."""
    cpu0, t0 = busy_s(), time.perf_counter()
    session = Session.up(**options)
    t1 = time.perf_counter()
    session.step(steps)
    t2 = time.perf_counter()
    session.down()
    t3 = time.perf_counter()
    return {"up": t1 - t0, "steps": t2 - t1, "down": t3 - t2, "cpu": busy_s() - cpu0}


SERVER_SIDES = {  # FORGE_NB_ZYGOTE, FORGE_NB_FORK_PREFORK
    "own interpreter": ("0", "0"),
    "forked from the server": ("0", "1"),
    "from a zygote": ("1", "1"),
}


def server_session(side: tuple[str, str], steps: int) -> dict[str, float]:
    """`forge_nb.up()` (a session server of its own), `steps` steps, down, with ``FORGE_NB_ZYGOTE`` and
    ``FORGE_NB_FORK_PREFORK`` as `side` says -> seconds of each, and the machine's CPU meanwhile (the server's
    included)."""
    import forge_nb

    os.environ["FORGE_NB_ZYGOTE"], os.environ["FORGE_NB_FORK_PREFORK"] = side
    cpu0, t0 = busy_s(), time.perf_counter()
    session = forge_nb.up(persist=False, **SESSION)
    t1 = time.perf_counter()
    session.step(steps, progress=False)
    t2 = time.perf_counter()
    session.down()
    t3 = time.perf_counter()
    return {"up": t1 - t0, "steps": t2 - t1, "down": t3 - t2, "cpu": busy_s() - cpu0}


def print_table(title: str, runs: dict[str, list[dict[str, float]]], ratios: list[tuple[str, str]]) -> None:
    print(title)
    header = "".join(f"{side + ' (mean ± sd)':>36}" for side in runs)
    print(f"{'seconds':<8}{header}" + "".join(f"{a + ' / ' + b:>44}" for a, b in ratios))
    for what in ("up", "steps", "down", "cpu"):
        cells, means = "", {}
        for side, rows in runs.items():
            values = [r[what] for r in rows]
            means[side] = statistics.mean(values)
            cells += f"{means[side]:>27.2f} ± {statistics.stdev(values) if len(values) > 1 else 0.0:<6.2f}"
        print(f"{what:<8}{cells}" + "".join(f"{means[a] / means[b]:>43.2f}x" for a, b in ratios))


def main_server(sessions: int, steps: int) -> None:
    from forge_nb.server import zygote

    server_session(SERVER_SIDES["from a zygote"], steps)  # starts the zygote the counted sessions find
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SERVER_SIDES}
    for _ in range(sessions):
        for side, values in SERVER_SIDES.items():
            runs[side].append(server_session(values, steps))
    title = f"\nforge_nb.up() of the bundled model (a session server each), up + {steps} steps + down"
    ratios = [("own interpreter", "forked from the server"), ("forked from the server", "from a zygote")]
    print_table(f"{title}; n = {sessions} sessions a side", runs, ratios)
    for name in ("FORGE_NB_ZYGOTE", "FORGE_NB_FORK_PREFORK"):
        os.environ.pop(name)
    zygote.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=5, help="sessions per side")
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--server", action="store_true", help="forge_nb.up(): a server afresh, or from a zygote")
    args = parser.parse_args()
    if args.server:
        return main_server(args.sessions, args.steps)
    one_session(SIDES["fresh"], 1)  # warm-up: this process imports what a kernel has after its first session
    runs: dict[str, list[dict[str, float]]] = {side: [] for side in SIDES}
    for _ in range(args.sessions):
        for side in ("fresh", "forked"):
            runs[side].append(one_session(SIDES[side], args.steps))
    one_session(SIDES["lingering"], args.steps)  # starts the server the lingering sessions find
    runs["lingering"] = [one_session(SIDES["lingering"], args.steps) for _ in range(args.sessions)]
    title = f"\nsession of the bundled model, up + {args.steps} steps + down; n = {args.sessions} sessions a side"
    print_table(title, runs, [("fresh", "forked"), ("fresh", "lingering")])
    for name in ("FORGE_NB_FORK_PROCS", "FORGE_NB_FORK_LINGER_S"):
        os.environ.pop(name)


if __name__ == "__main__":
    main()
