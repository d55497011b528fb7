"""Reward throughput: rule verifications/s of the reward pool with 1, 2 and 4 reward procs, and judge verdicts/s,
each beside the same work done in one process (the kernel, no actors), in one run.

A verification is one sample scored by a reward: the built-in exact match (per sample, reads the label), or the
label-free rule ensemble `Ensemble(addition_verifiers())` (six weak verifiers voted, the latent-variable fit over
the proc's window, P(correct) returned). The samples are real completions of the bundled model on the addition task,
made once and scored by every configuration.

Both sides do the same work on the same samples, with the same compiled reward set and the same scoring function
(`rewards.scoring.score_members`, what a reward worker runs):
- reward pool: `Fleet.score` from the controller: the batch split evenly over P reward procs (as `Session.rollout`
  does), sent as columns, scored in parallel, scores back;
- in kernel: the same P shards scored one after another in this process, each by its own copy of the reward set
  (an ensemble keeps a window per proc, so the kernel keeps one per shard as well).
Blocks alternate between the two sides so machine noise hits both alike.

The judge: `judge()` (SmolLM2-135M-Instruct, P("Yes") from one forward pass per message, `--judge-batch` messages
per forward pass) as the session's reward on batches of `--judge-samples` samples, end to end through the reward
pool and the judge actor, beside the same messages run by the same `JudgeModel` in this process with the judge's
thread budget.

    python benchmarks/reward_throughput.py [--procs 1 2 4] [--sizes 256 4096] [--seconds 6] [--judge-samples 64]

Every reward proc gets `--threads` torch threads; 4 reward procs oversubscribe 2 cores (and the controller and the
idle generator and trainer procs share them too). Goal: >= 10,000 rule verifications/s.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch

from forge_nb.live.capture import compile_function
from forge_nb.models.registry import resolve_model
from forge_nb.rewards import Ensemble, addition_verifiers, judge
from forge_nb.rewards.batch import RewardBatch, Scores
from forge_nb.rewards.judge import render
from forge_nb.rewards.judge_model import JudgeModel
from forge_nb.rewards.scoring import score_members
from forge_nb.rewards.verdicts import JudgeRequest
from forge_nb.rl.pipeline import reward_batch
from forge_nb.runtime.calls import shards
from forge_nb.session import Session

EXACT = "exact match (per sample)"
ENSEMBLE = "rule ensemble (batched)"


def samples(session, n: int) -> RewardBatch:
    """`n` real completions of the bundled model on training prompts, as one batch of columns."""
    group = session.config.algorithm.group_size
    rollout = session.rollout(session.state.task.sample(-(-n // group)))
    return reward_batch(rollout.episodes[:n], step=0)


def in_kernel(session, procs: int) -> Callable[[RewardBatch], None]:
    """Scores a batch as the reward pool does -- the same compiled reward set, split into the same shards --
    one shard after another in this process, one copy of the reward set per shard."""
    members = session.registry.members("reward")
    copies = [{name: compile_function(m.code) for name, m in members.items()} for _ in range(procs)]
    weights = {name: m.weight for name, m in members.items()}

    def score(batch: RewardBatch) -> None:
        for fns, part in zip(copies, shards(len(batch), procs)):
            shard = batch.shard(part)
            components, errors = {name: [None] * len(shard) for name in fns}, {}
            score_members(fns, shard, components, errors)
            assert not errors, errors
            Scores.combine(components, weights, errors, 0)

    return score


def through_pool(session) -> Callable[[RewardBatch], None]:
    def score(batch: RewardBatch) -> None:
        for _, scores in session.fleet.score(batch):
            assert not scores.errors, scores.errors

    return score


def side_by_side(sides: dict[str, Callable], parts: list[RewardBatch], seconds: float, blocks: int) -> dict:
    """Samples/s of each side, scoring `parts` over and over: `blocks` alternating blocks of `seconds / blocks`
    each per side (after one warm-up call each) -> side -> samples/s over all its blocks."""
    for score in sides.values():
        score(parts[0])  # warm: the first call compiles, fills caches, starts the fit
    done, spent = dict.fromkeys(sides, 0), dict.fromkeys(sides, 0.0)
    for _ in range(blocks):
        for name, score in sides.items():
            start = time.perf_counter()
            while time.perf_counter() - start < seconds / blocks:
                for part in parts:
                    score(part)
                    done[name] += len(part)
            spent[name] += time.perf_counter() - start
    return {name: done[name] / spent[name] for name in sides}


def rule_rates(procs: int, batch: RewardBatch, sizes: list[int], seconds: float, blocks: int, threads: int) -> dict:
    """(reward, samples per call) -> {"kernel": samples/s, "pool": samples/s} with `procs` reward procs."""
    session = Session.up(reward_procs=procs, threads_per_proc=threads, engine="torch")
    out = {}
    try:
        for reward in (EXACT, ENSEMBLE):
            if reward == ENSEMBLE:
                session.set_reward(Ensemble(addition_verifiers()))  # replaces the exact match: the only reward
            for size in sizes:
                parts = [batch.shard(slice(i, i + size)) for i in range(0, len(batch) - size + 1, size)]
                sides = {"kernel": in_kernel(session, procs), "pool": through_pool(session)}
                out[(reward, size)] = side_by_side(sides, parts, seconds, blocks)
        return out
    finally:
        session.down()


def judge_rates(n: int, batch_size: int, rounds: int, threads: int) -> dict:
    """Verdicts/s of the judge: through the pool and the judge actor, and the same messages in this process."""
    session = Session.up(reward_procs=1, threads_per_proc=threads, engine="torch")
    try:
        batch = samples(session, n)
        start = time.perf_counter()
        reward = judge(batch_size=batch_size)
        session.set_reward(reward, name="judge", weight=0.0)  # starts the judge actor
        started = time.perf_counter() - start
        messages = render(reward.template, {k: v for k, v in batch.columns().items() if k != "targets"})
        request = JudgeRequest(messages, "choice", reward.choices, reward.system_prompt, 1, batch_size)
        torch.set_num_threads(threads)
        local = JudgeModel.load(resolve_model(reward.model))
        local.answer(request)  # warm, as the judge actor was by the check of set_reward
        times: dict[str, list[float]] = {"kernel": [], "pool": []}
        for _ in range(rounds):
            start = time.perf_counter()
            local.answer(request)
            times["kernel"].append(time.perf_counter() - start)
            start = time.perf_counter()
            for _, scores in session.fleet.score(batch):
                assert not scores.errors, scores.errors
            times["pool"].append(time.perf_counter() - start)
        rows = session.metrics_stream.rows("judge")[-rounds:]
        return {
            "kernel": n * rounds / sum(times["kernel"]),
            "pool": n * rounds / sum(times["pool"]),
            "judge_compute": sum(r["verdicts"] for r in rows) / sum(r["judge_s"] for r in rows),
            "tokens_per_s": sum(r["tokens"] for r in rows) / sum(r["judge_s"] for r in rows),
            "latency_s": statistics.median(r["latency_s"] for r in rows),
            "start_s": started,
        }
    finally:
        session.down()


def print_rules(results: dict, procs: list[int], sizes: list[int], seconds: float, blocks: int, n: int) -> None:
    print(
        f"\nrule verifications/s: {n} real samples of the bundled model, scored over and over; "
        f"{seconds:g} s per side per cell in {blocks} alternating blocks\n"
    )
    print(f"{'reward':<26}{'samples/call':>13}{'procs':>6}{'in kernel':>12}{'reward pool':>13}{'pool/kernel':>13}")
    for reward in (EXACT, ENSEMBLE):
        for size in sizes:
            for p in procs:
                r = results[p][(reward, size)]
                print(
                    f"{reward:<26}{size:>13}{p:>6}{r['kernel']:>12,.0f}{r['pool']:>13,.0f}"
                    f"{r['pool'] / r['kernel']:>12.2f}x"
                )
    best = max((results[p][(ENSEMBLE, s)]["pool"], p, s) for p in procs for s in sizes)
    verifiers = len(addition_verifiers())
    print(
        f"\nbest ensemble rate through the pool: {best[0]:,.0f} verifications/s ({best[1]} procs, {best[2]} "
        f"samples/call) = {best[0] * verifiers:,.0f} verifier calls/s ({verifiers} verifiers each)"
    )
    print(f"goal: >= 10,000 rule verifications/s -> {'met' if best[0] >= 10_000 else 'NOT met'}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--sizes", type=int, nargs="+", default=[256, 4096], help="samples per score call")
    parser.add_argument("--seconds", type=float, default=6.0, help="measuring time per side per cell")
    parser.add_argument("--blocks", type=int, default=3, help="alternating blocks per cell")
    parser.add_argument("--threads", type=int, default=1, help="torch threads per reward proc")
    parser.add_argument("--judge-samples", type=int, default=64, help="samples per judged batch (0: skip)")
    parser.add_argument("--judge-batch", type=int, default=32, help="messages per judge forward pass")
    parser.add_argument("--judge-rounds", type=int, default=3)
    parser.add_argument("--judge-threads", type=int, default=2, help="torch threads of the judge (both sides)")
    args = parser.parse_args()

    sampler = Session.up(engine="torch")
    try:
        batch = samples(sampler, max(args.sizes))
    finally:
        sampler.down()
    results = {p: rule_rates(p, batch, args.sizes, args.seconds, args.blocks, args.threads) for p in args.procs}
    j = (
        judge_rates(args.judge_samples, args.judge_batch, args.judge_rounds, args.judge_threads)
        if args.judge_samples
        else None
    )
    print_rules(results, args.procs, args.sizes, args.seconds, args.blocks, len(batch))
    if j is not None:
        print(
            f"\njudge verdicts/s: SmolLM2-135M-Instruct, P(Yes) from one forward pass, {args.judge_samples} samples "
            f"per batch, {args.judge_batch} per forward pass, {args.judge_threads} torch threads, "
            f"{args.judge_rounds} batches per side, alternating\n"
        )
        print(f"{'in kernel':>12}{'reward pool':>13}{'pool/kernel':>13}")
        print(f"{j['kernel']:>12.2f}{j['pool']:>13.2f}{j['pool'] / j['kernel']:>12.2f}x")
        print(
            f"\njudge actor (metrics stream): {j['judge_compute']:.2f} verdicts per compute second, "
            f"{j['tokens_per_s']:.0f} prompt tokens/s, median latency per call {j['latency_s']:.2f} s; "
            f"set_reward(judge()) incl. starting the judge actor {j['start_s']:.1f} s"
        )


if __name__ == "__main__":
    main()
