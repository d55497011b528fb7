"""Rewards without labels on the bundled addition task, in one run: how well the weak-verifier ensemble tells right
from wrong on held-out labelled samples, and GRPO trained on it alone beside GRPO trained on the labels.

1. Held-out labelled samples: `--samples` completions of the task's held-out prompts (4 per prompt, temperature 1)
   from the bundled model before training and from the policy after label-free GRPO. Each weak verifier of
   `addition_verifiers()` votes; the ensemble (`Ensemble`, a Dawid-Skene fit over the votes, no labels) gives
   P(correct). Accuracy of each against the task's exact check (a verifier's abstention counts as "wrong"), beside
   the best single verifier and the majority vote of the same votes; the ensemble's P(correct) is also scored as a
   probability (Brier score; mean P against the share actually correct).
2. The model judge as one more weak verifier: on the first `--judge-samples` of each set, SmolLM2-135M-Instruct's
   P("Yes") (`judge()`'s template, run here by the same `JudgeModel` the judge actor runs), alone and added to the
   rule ensemble.
3. GRPO, same seed, same number of steps, same config: one session trains on the built-in exact match (the label),
   the other on `Ensemble(addition_verifiers())` alone (it never sees a target). Held-out accuracy before -> after,
   greedy (one completion per prompt) and sampled (4 per prompt at temperature 1, as the policy trains), the batch
   accuracy (task verifier) of the first and last tenth of the steps, and how often the ensemble's reward (P > 0.5)
   agreed with the label on the last samples it scored.

    python benchmarks/label_free.py [--steps 1000] [--samples 800] [--judge-samples 128] [--engine torch]
"""

from __future__ import annotations

import argparse
import sys
import time

import numpy as np
import torch

from forge_nb.models.registry import resolve_model
from forge_nb.rewards import Ensemble, addition_verifiers
from forge_nb.rewards.ensemble import binarize, thresholds
from forge_nb.rewards.judge import DEFAULT_MODEL, DEFAULT_TEMPLATE, render
from forge_nb.rewards.judge_model import JudgeModel
from forge_nb.rewards.verdicts import JudgeRequest
from forge_nb.rewards.weaver import majority_vote
from forge_nb.rl.episode import Episode
from forge_nb.session import Session

SETS = ("before training", "after label-free GRPO")


def columns(episodes: list[Episode]) -> dict[str, list]:
    """What an ensemble is called with (no targets)."""
    return {
        "prompts": [e.prompt for e in episodes],
        "completions": [e.completion for e in episodes],
        "prompt_id": [e.prompt_id for e in episodes],
    }


def verifier_table(episodes: list[Episode], labels: np.ndarray, verifiers: list) -> tuple[dict[str, float], str]:
    """Accuracy against `labels` of each verifier, the best one, the majority vote and the ensemble's fit; the
    ensemble's Brier score and mean P(correct) -> (that row, the best verifier's name)."""
    ensemble = Ensemble(verifiers)
    p = np.array(ensemble(**columns(episodes)))
    votes = ensemble.votes(**columns(episodes))
    said_correct = binarize(votes, thresholds(votes)) == 1.0  # a judge's grade is cut at its mean, as in the fit
    row = {name: float((said_correct[:, k] == labels).mean()) for k, name in enumerate(ensemble.names)}
    best = max(row, key=row.get)
    row |= {
        "best single verifier": row[best],
        "majority vote": float(((majority_vote(said_correct.astype(float)) > 0.5) == labels).mean()),
        "ensemble, P(correct) > 0.5": float(((p > 0.5) == labels).mean()),
        "ensemble: Brier score": float(((p - labels) ** 2).mean()),
        "ensemble: mean P(correct)": float(p.mean()),
        "share correct (label)": float(labels.mean()),
    }
    return row, best


def local_judge(threads: int):
    """The judge as a batched verifier run in this process: `judge()`'s template and P("Yes") parser, with the
    model the judge actor would load."""
    torch.set_num_threads(threads)
    model = JudgeModel.load(resolve_model(DEFAULT_MODEL))

    verdicts: dict[tuple[str, str], float] = {}  # each sample is judged once, alone and in the ensemble alike

    def model_judge(prompts: list[str], completions: list[str]) -> list[float]:
        new = [(p, c) for p, c in dict.fromkeys(zip(prompts, completions)) if (p, c) not in verdicts]
        if new:
            messages = render(DEFAULT_TEMPLATE, {"prompts": [p for p, _ in new], "completions": [c for _, c in new]})
            answer = model.answer(JudgeRequest(messages, "choice", ("Yes", "No"), "", 1, 32))
            verdicts.update(zip(new, answer.probabilities))
        return [verdicts[(p, c)] for p, c in zip(prompts, completions)]

    return model_judge


def grpo(reward: str, args: argparse.Namespace) -> dict:
    """Held-out accuracy, greedy and sampled, before and after `args.steps` GRPO steps trained on `reward`
    ("label" or "ensemble"), and the held-out sample sets (with their labels) it was measured on."""
    print(f"GRPO on {reward}: {args.steps} steps", file=sys.stderr, flush=True)
    s = Session.up(engine=args.engine, seed=args.seed)
    try:
        if reward == "ensemble":
            s.set_reward(Ensemble(addition_verifiers()))  # replaces the built-in exact match: the only reward
        sets = {SETS[0]: s.probe_samples(args.samples)}  # 4 samples per held-out prompt, labelled by the exact check
        before = s.evaluate()["heldout_accuracy"]
        start = time.perf_counter()
        s.step(args.steps, progress=False)
        seconds = time.perf_counter() - start
        after = s.evaluate()["heldout_accuracy"]
        sets[SETS[1]] = s.probe_samples(args.samples)
        steps = s.metrics_stream.to_pandas("step")
        tenth = max(1, len(steps) // 10)
        last = s.state.buffer.recent(10_000)
        labels = np.array([s.state.task.verify(e.completion, e.target) for e in last])
        agreement = ((np.array([e.reward for e in last]) > 0.5) == labels).mean()
        return {
            "greedy": (before, after),
            "sampled": tuple(float(np.mean([e.reward for e in sets[name]])) for name in SETS),
            "batch": (float(steps.accuracy.iloc[:tenth].mean()), float(steps.accuracy.iloc[-tenth:].mean())),
            "agreement": f"{agreement:.3f}" if reward == "ensemble" else "(is it)",
            "seconds": seconds,
            "sets": sets,
        }
    finally:
        s.down()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=1000, help="GRPO steps of each session")
    parser.add_argument("--samples", type=int, default=800, help="held-out samples per set of the verifier table")
    parser.add_argument("--judge-samples", type=int, default=128, help="of those, judged by the model (0: none)")
    parser.add_argument("--judge-threads", type=int, default=2)
    parser.add_argument("--engine", default="torch", choices=("torch", "vllm"))
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    runs = {"ensemble (no labels)": grpo("ensemble", args), "exact match (labels)": grpo("label", args)}
    sets = runs["ensemble (no labels)"]["sets"]
    labels = {name: np.array([e.reward for e in episodes]) for name, episodes in sets.items()}  # the exact check
    rules = {name: verifier_table(sets[name], labels[name], addition_verifiers()) for name in SETS}
    judged = {}
    if args.judge_samples:
        model_judge = local_judge(args.judge_threads)
        n = args.judge_samples
        for name in SETS:
            first, y = sets[name][:n], labels[name][:n]
            judged[name] = {
                "judge alone (P(Yes) cut at its mean)": verifier_table(first, y, [model_judge])[0]["model_judge"],
                "rule ensemble": verifier_table(first, y, addition_verifiers())[0]["ensemble, P(correct) > 0.5"],
                "rule ensemble + judge": verifier_table(first, y, [*addition_verifiers(), model_judge])[0][
                    "ensemble, P(correct) > 0.5"
                ],
                "share correct (label)": float(y.mean()),
            }

    print(f"\n1. held-out labelled samples ({args.samples} per set, 4 per prompt): accuracy against the exact check\n")
    print(f"{'':<34}" + "".join(f"{name:>24}" for name in SETS))
    for key in rules[SETS[0]][0]:
        print(f"{key:<34}" + "".join(f"{rules[name][0][key]:>24.3f}" for name in SETS))
    print(f"{'  (best single verifier)':<34}" + "".join(f"{rules[name][1]:>24}" for name in SETS))
    if judged:
        print(f"\n2. the model judge as a weak verifier, on the first {args.judge_samples} samples of each set\n")
        print(f"{'':<40}" + "".join(f"{name:>24}" for name in SETS))
        for key in judged[SETS[0]]:
            print(f"{key:<40}" + "".join(f"{judged[name][key]:>24.3f}" for name in SETS))
    print(f"\n3. GRPO, {args.steps} steps each, same seed and config, {args.engine} engine: held-out accuracy\n")
    print(
        f"{'trained on':<24}{'greedy before/after':>22}{'sampled before/after':>23}{'batch first/last 10%':>23}"
        f"{'reward=label':>14}{'train s':>9}"
    )
    for name, r in runs.items():
        cells = "".join(
            f"{f'{a:.3f} -> {b:.3f} ({b - a:+.3f})':>{w}}"
            for (a, b), w in zip((r["greedy"], r["sampled"], r["batch"]), (22, 23, 23))
        )
        print(f"{name:<24}{cells}{r['agreement']:>14}{r['seconds']:>9.0f}")
    for metric in ("greedy", "sampled"):
        gain = {name: r[metric][1] - r[metric][0] for name, r in runs.items()}
        labelled = gain["exact match (labels)"]
        ratio = f"{gain['ensemble (no labels)'] / labelled:.2f}x" if labelled > 0 else "n/a (no gain with labels)"
        print(f"{metric} held-out gain without labels / with labels: {ratio}")
    print(
        f"greedy: one completion per held-out prompt; sampled: {args.samples} completions, 4 per held-out prompt at "
        "temperature 1 (the ensemble run's are table 1's); batch: the task verifier on the training batches"
    )
    print("reward=label: share of the last 10,000 training samples whose reward (> 0.5) matched the exact check")


if __name__ == "__main__":
    main()
