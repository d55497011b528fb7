"""The built-in losses side by side: the same task, model, steps and seeds, one run each, one table.

Each loss trains the bundled model on the bundled addition task for `--steps` trainer steps (32 prompts x 8
samples a step), `--seeds` times (seeds 1..n; every loss sees the same seeds), asynchronously by default
(``max_staleness`` 2: batches up to two policy versions old, so the ratios move off 1 and the clips, caps and
gates differ; on-policy, with ``--mode sync``, every loss here is close to the plain policy gradient). Reported per
loss: held-out greedy accuracy before and after (200 problems; the seed picks them) as the mean over seeds ± its
standard error (n = seeds), the mean training reward and the policy's mean entropy per token (nats) over the last
50 steps (mean ± SE), the clip fraction (share of tokens whose ratio is outside the clip, as each loss's metric
counts it), the k1 KL(generator || policy) at the step (`approx_kl`), the mean staleness, the optimizer steps per
batch (`updates`: more than 1 with `algorithm.epochs` or `algorithm.mini_batches`), the median train seconds per
step (the loss's cost is inside it) and the mean wall seconds of a run.

    python benchmarks/losses.py [--steps 600] [--seeds 4] [--mode async|sync]
"""

from __future__ import annotations

import argparse
import statistics
import time

from forge_nb.session import Session

#: name -> the config a user would give (TRL's recipes where there is one).
LOSSES = {
    "grpo": {"loss": "grpo"},
    "dapo": {"loss": "dapo"},  # clip-higher 0.28, token-level mean
    "gspo": {"loss": "grpo", "ratio_level": "sequence", "clip_eps": 3e-4, "clip_high": 4e-4},  # the paper's clips
    "cispo": {"loss": "cispo", "rho_max": 5.0},  # ScaleRL's epsilon_max
    "sapo": {"loss": "sapo"},
    "luspo": {"loss": "luspo", "ratio_level": "sequence", "clip_eps": 3e-4, "clip_high": 4e-4},  # GSPO's, length-summed
    "vespo": {"loss": "vespo"},  # TRL's Gamma shapes: k 2 / 3, lambda 3 / 2
    # Several optimizer steps a batch (rl/epochs.py): grpo twice over each batch, and in 4 mini-batches of 8 groups;
    # then the same with the learning rate (5e-4) divided by the steps, as AdamW moves each step by about lr.
    "grpo-e2": {"loss": "grpo", "epochs": 2},
    "grpo-m4": {"loss": "grpo", "mini_batches": 4},
    "e2-lr/2": {"loss": "grpo", "epochs": 2, "lr": 2.5e-4},
    "m4-lr/4": {"loss": "grpo", "mini_batches": 4, "lr": 1.25e-4},
    # "Beyond the 80/20 rule" (Wang et al., 2025): DAPO's loss on the top 20% of tokens by entropy only.
    "dapo-te.2": {"loss": "dapo", "top_entropy_quantile": 0.2},
}


def one_run(overrides: dict, seed: int, steps: int, mode: str) -> dict:
    s = Session.up(seed=seed, threads_per_proc=1, **overrides)
    try:
        before = s.evaluate(greedy=True)["heldout_accuracy"]  # the seed picks the held-out problems
        started = time.perf_counter()
        s.run(steps=steps, mode=mode, max_staleness=2).wait()
        seconds = time.perf_counter() - started
        rows, train = s.metrics_stream.to_pandas("step"), s.metrics_stream.to_pandas("train")
        return {
            "before": before,
            "heldout": s.evaluate(greedy=True)["heldout_accuracy"],
            "reward": float(rows.tail(50).mean_reward.mean()),
            "clip": float(rows.clip_fraction.mean()),
            "kl": float(train.approx_kl.mean()),
            "entropy": float(train.entropy.tail(50).mean()),
            "train_s": float(rows.train_s.median()),
            "staleness": float(rows.staleness.mean()),
            "updates": float(train.updates.mean()),
            "seconds": seconds,
        }
    finally:
        s.down()


def mean_se(values: list[float]) -> str:
    se = statistics.stdev(values) / len(values) ** 0.5 if len(values) > 1 else float("nan")
    return f"{statistics.mean(values):.3f} ± {se:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--seeds", type=int, default=4)
    parser.add_argument("--mode", default="async", choices=("async", "sync"))
    parser.add_argument("--only", nargs="*", default=list(LOSSES), choices=list(LOSSES))
    args = parser.parse_args()
    results = {}
    for name in args.only:
        results[name] = [one_run(LOSSES[name], seed, args.steps, args.mode) for seed in range(1, args.seeds + 1)]
        print(f"{name}: done ({sum(r['seconds'] for r in results[name]):.0f} s)", flush=True)
    print(
        f"\n{args.steps} steps x {args.seeds} seeds each, {args.mode} (max_staleness 2), bundled model and task; "
        f"mean ± standard error over the {args.seeds} seeds\n"
    )
    columns = ["held-out before", "held-out after", "reward, last 50", "entropy, last 50", "clip frac", "approx_kl"]
    columns += ["staleness", "updates", "train s", "run s"]
    print(f"{'loss':<9}" + "".join(f"{c:>17}" for c in columns))
    for name, runs in results.items():
        cells = [mean_se([r[k] for r in runs]) for k in ("before", "heldout", "reward", "entropy")]
        cells += [f"{statistics.mean(r[k] for r in runs):.{d}f}" for k, d in (("clip", 4), ("kl", 5), ("staleness", 2))]
        cells.append(f"{statistics.mean(r['updates'] for r in runs):.2f}")
        cells.append(f"{statistics.median(r['train_s'] for r in runs):.4f}")
        cells.append(f"{statistics.mean(r['seconds'] for r in runs):.0f}")
        print(f"{name:<9}" + "".join(f"{c:>17}" for c in cells))
    print("\nconfigs: " + "; ".join(f"{k} {v}" for k, v in LOSSES.items() if k in results))


if __name__ == "__main__":
    main()
