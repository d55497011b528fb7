"""Sync vs async training under the same wall-clock budget on the local mesh, one run.

sync:  rollout -> train -> sync, one after the other (2 torch threads per proc: phases never overlap)
async: generation and training overlap (1 thread per proc on 2 cores), max staleness 1, AIPO loss

Reported: trained samples per second, dropped samples, mean reward over the last quarter of the
budget, and held-out greedy accuracy at the end (both sessions start from the same model and seed).
Then the ceiling that overlap can reach on this machine, from the two runs' median phase times:
with one proc per phase the step takes max(generate + score, train) at 1 thread each, and no
split of the same work over C cores beats (generate + score + train) / C at 1 thread.

    python benchmarks/async_vs_sync.py [--seconds 60]
"""

from __future__ import annotations

import argparse
import os
import time

from forge_nb.session import Session


def measure(mode: str, seconds: float, async_threads: int, engine: str) -> dict:
    overrides = {"threads_per_proc": 2} if mode == "sync" else {"threads_per_proc": async_threads, "loss": "aipo"}
    s = Session.up(engine=engine, **overrides)
    try:
        before = s.evaluate()["heldout_accuracy"]
        start = time.perf_counter()
        run = s.run(mode=mode, max_staleness=1)
        time.sleep(seconds)
        run.stop()
        elapsed = time.perf_counter() - start
        steps = s.metrics_stream.to_pandas("step")
        trained = len(steps) * s.config.algorithm.prompts_per_step * s.config.algorithm.group_size
        tail = steps[steps.time >= steps.time.min() + 0.75 * (steps.time.max() - steps.time.min())]
        return {
            "steps": len(steps),
            "samples_per_s": trained / elapsed,
            "dropped": getattr(run, "dropped", 0),
            "final_reward": tail.mean_reward.mean(),
            "heldout_before": before,
            "heldout_after": s.evaluate()["heldout_accuracy"],
            "staleness": dict(getattr(run, "staleness", {0: len(steps)})),
            "phases": _phase_medians(steps),
        }
    finally:
        s.down()


def _phase_medians(steps) -> dict[str, float]:
    """Median seconds per step of each phase, after the first 10 steps (warm-up)."""
    steady = steps.iloc[10:] if len(steps) > 20 else steps
    return {
        "rollout": float((steady.generate_s + steady.score_s).median()),
        "train": float(steady.train_s.median()),
        "step": float(steady.step_s.median()),
    }


def print_ceiling(sync: dict[str, float], overlapped: dict[str, float], cores: int) -> None:
    """How far async can beat sync here, from phase times measured in the two runs."""
    pipeline = max(overlapped["rollout"], overlapped["train"])
    any_split = (overlapped["rollout"] + overlapped["train"]) / cores
    print(f"\n{'median s/step':<14}{'generate+score':>16}{'train':>9}{'step':>9}")
    for mode, p in (("sync", sync), ("async", overlapped)):
        print(f"{mode:<14}{p['rollout']:>16.4f}{p['train']:>9.4f}{p['step']:>9.4f}")
    print(
        f"ceiling of async / sync here: one proc per phase {sync['step'] / pipeline:.2f}x, "
        f"any split of the work over {cores} cores {sync['step'] / any_split:.2f}x"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--async-threads", type=int, default=1, help="torch threads per proc in async mode")
    parser.add_argument("--engine", default="torch", choices=("torch", "vllm"), help="generation engine (both modes)")
    args = parser.parse_args()
    results = {mode: measure(mode, args.seconds, args.async_threads, args.engine) for mode in ("sync", "async")}
    print(f"\nsame budget: {args.seconds:.0f} s each, {args.engine} engine, bundled model, 32 prompts x 8 samples\n")
    print(f"{'mode':<7}{'steps':>7}{'samples/s':>11}{'dropped':>9}{'final reward':>14}{'held-out':>16}  staleness")
    for mode, r in results.items():
        heldout = f"{r['heldout_before']:.3f}->{r['heldout_after']:.3f}"
        print(
            f"{mode:<7}{r['steps']:>7}{r['samples_per_s']:>11.1f}{r['dropped']:>9}{r['final_reward']:>14.3f}"
            f"{heldout:>16}  {r['staleness']}"
        )
    ratio = results["async"]["samples_per_s"] / results["sync"]["samples_per_s"]
    print(f"\nasync / sync samples/s: {ratio:.2f}x (goal >= 1.5x at equal or better reward)")
    print_ceiling(results["sync"]["phases"], results["async"]["phases"], os.cpu_count() or 1)


if __name__ == "__main__":
    main()
