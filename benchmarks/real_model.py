"""A real model learns: SmolLM2-135M-Instruct on arithmetic word problems, held-out accuracy before -> after
`--minutes` of GRPO on this machine, and GRPO steps/s vs TRL's GRPOTrainer on the same model, data and batch,
in one run.

Data: `forge_nb.tasks.word_problems` (seeded): `--train` problems to train on and `--heldout` others (a disjoint
seed) to evaluate on, chat messages through the model's template; the only reward is the final number against
the answer (`forge_nb.rewards.answer_match`). Accuracy is greedy, on every held-out problem.

Both sides: P prompts x G samples per optimizer step, at most `--max-tokens` new tokens, temperature 1, the GRPO
loss (sequence-level, ratio clip 0.2, advantages normalised by the group's sample std, no KL), AdamW at `--lr`,
grad-norm clip 1.0, float32 on the CPU. TRL runs in this process with HF `generate` (its default without vLLM);
forge_nb runs its mesh (generator, trainer and reward procs, `--threads` torch threads each). forge_nb's trainer
leaves zero-advantage sequences out of its forward/backward (the loss and the update are the same; TRL does not
do this), so the table also has forge_nb without that skip, measured over `--noskip-steps` more steps with the
same loss given as a live loss (which is never skipped). Needs `make bench-deps` (TRL) and the model package.

    python benchmarks/real_model.py [--minutes 5] [--prompts 8] [--group 4] [--max-tokens 48] [--trl-steps 6]

With --lora the same run also trains a LoRA adapter (rank --rank on every attention and MLP projection,
`--lora-lr`) in forge_nb and in TRL + peft, so the table has full fine-tuning and LoRA side by side, with each
trainer's peak RSS (forge_nb: the trainer proc's VmHWM; TRL: this process's, which is TRL's peak).

    python benchmarks/real_model.py --lora [--rank 16] [--lora-lr 2e-4]
"""

from __future__ import annotations

import argparse
import multiprocessing
import statistics
import time
from concurrent.futures import ProcessPoolExecutor

import torch
from trl_baseline import NOSKIP_LOSS, grpo_config, median_step_s, step_clock

from forge_nb.rewards import answer_match
from forge_nb.session import Session
from forge_nb.tasks.word_problems import word_problems

MODEL = "smollm2-135m-instruct"


def data(args: argparse.Namespace) -> tuple[list[dict], list[dict]]:
    train = word_problems(args.train, seed=args.seed, top=args.top)
    seen = {r["prompt"][0]["content"] for r in train}
    others = word_problems(args.heldout * 3, seed=args.seed + 1, top=args.top)
    return train, [r for r in others if r["prompt"][0]["content"] not in seen][: args.heldout]


def peak_rss_mb(pid: int | str = "self") -> float:
    """A process's peak resident memory (VmHWM) in MB."""
    with open(f"/proc/{pid}/status") as f:
        kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM:"))
    return kb / 1024


def lora_settings(args: argparse.Namespace) -> dict:
    return {"r": args.rank, "alpha": 2 * args.rank, "dropout": 0.0}


def forge_nb_run(args: argparse.Namespace, train: list[dict], heldout: list[dict], lora: bool = False) -> dict:
    """Evaluate, train for `args.minutes`, evaluate; then time steps without the zero-advantage skip.
    With `lora`, a LoRA adapter trains (at `args.lora_lr`) instead of every weight."""
    extra = {"lora": lora_settings(args)} if lora else {}
    s = Session.up(
        model=MODEL,
        task={"train": train, "eval": heldout},
        eval_size=len(heldout),
        engine=args.engine,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_tokens=args.max_tokens,
        temperature=args.temperature,
        lr=args.lora_lr if lora else args.lr,
        loss="grpo",
        threads_per_proc=args.threads,
        seed=args.seed,
        **extra,
    )
    try:
        before = s.evaluate()
        print(f"forge_nb: held-out accuracy before {before['heldout_accuracy']:.3f}", flush=True)
        rows, deadline = [], time.perf_counter() + args.minutes * 60
        while time.perf_counter() < deadline:
            row = s.step(1, progress=False).iloc[0]
            rows.append(row)
            print(
                f"  step {len(rows):3d}: reward {row.mean_reward:.3f}, {row.step_s:.1f} s "
                f"(generate {row.generate_s:.1f}, train {row.train_s:.1f}, refresh {row.refresh_s:.2f})",
                flush=True,
            )
        after = s.evaluate()
        timed = [r.step_s for r in rows[args.warmup :]] or [r.step_s for r in rows]  # a run of one step: its own
        skipped = s.metrics_stream.to_pandas("train").rows_skipped.iloc[args.warmup :].sum()
        trained = s.metrics_stream.to_pandas("train").tokens.iloc[args.warmup :].size * args.prompts * args.group
        s.set_loss(NOSKIP_LOSS)
        noskip = s.step(args.noskip_steps, progress=False).step_s.tolist()
        trainer_rss = peak_rss_mb(s.status()["procs"]["trainer"][0])
    finally:
        s.down()
    return {
        "before": before["heldout_accuracy"],
        "after": after["heldout_accuracy"],
        "steps": len(rows),
        "reward_first": statistics.fmean(r.mean_reward for r in rows[:5]),
        "reward_last": statistics.fmean(r.mean_reward for r in rows[-5:]),
        "step_s": statistics.median(timed),
        "noskip_step_s": statistics.median(noskip),
        "skipped_share": skipped / max(1, trained),
        "rss_mb": trainer_rss,
    }


def trl_run(args: argparse.Namespace, train: list[dict], lora: bool = False) -> float:
    """TRL's median seconds per step over `args.trl_steps` steps after one warm-up step (with `lora`,
    TRL + peft: a `peft_config` of the same adapter, at `args.lora_lr`)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    from forge_nb.models import resolve_model

    def reward(completions, answer, **_) -> list[float]:
        return [answer_match(c[0]["content"] if isinstance(c, list) else c, a) for c, a in zip(completions, answer)]

    path = str(resolve_model(MODEL))
    samples, lr = args.prompts * args.group, args.lora_lr if lora else args.lr
    config = grpo_config(
        "/tmp/forge_nb_real_model_trl",
        samples,
        args.group,
        args.max_tokens,
        lr,
        1 + args.trl_steps,
        args.seed,
        temperature=args.temperature,
    )
    times = step_clock()
    trainer = GRPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32),
        reward_funcs=reward,
        args=config,
        train_dataset=Dataset.from_list([{"prompt": r["prompt"], "answer": r["answer"]} for r in train]),
        processing_class=AutoTokenizer.from_pretrained(path),
        callbacks=[times],
        peft_config=_peft_config(args) if lora else None,
    )
    start = time.perf_counter()
    trainer.train()
    return median_step_s(start, times.times)


def _peft_config(args: argparse.Namespace):
    from forge_nb.config import Config
    from forge_nb.lora.targets import peft_config

    return peft_config(Config().updated({"lora": lora_settings(args)}).lora)


def _trl_lora_child(args: argparse.Namespace, train: list[dict]) -> tuple[float, float]:
    torch.set_num_threads(args.threads)
    return trl_run(args, train, lora=True), peak_rss_mb()


def lora_table(args: argparse.Namespace, train: list[dict], heldout: list[dict], full: dict, trl: float) -> None:
    """forge_nb LoRA and TRL + peft beside the full fine-tuning runs: steps/s, accuracy, trainer peak RSS."""
    ours = forge_nb_run(args, train, heldout, lora=True)
    torch.set_num_threads(args.threads)
    trl_full_rss = peak_rss_mb()  # TRL full ran in this process already: its peak so far
    # TRL + peft in a fresh process of its own: a peak RSS never goes down, so this one's would hide it.
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        trl_lora, trl_lora_rss = pool.submit(_trl_lora_child, args, train).result()
    print(f"\nLoRA r={args.rank} (alpha {2 * args.rank}, lr {args.lora_lr:g}) vs full fine-tuning (lr {args.lr:g})")
    print("'vs TRL': against TRL in the same mode (full: TRL full; LoRA: TRL + peft)\n")
    header = f"{'':<44}{'s/step':>8}{'steps/s':>9}{'vs TRL':>8}{'accuracy before -> after':>27}{'peak RSS MB':>13}"
    print(header)
    rows = [
        ("forge_nb full, zero-advantage rows skipped", full["step_s"], trl, _accuracy(full), full["rss_mb"]),
        ("forge_nb full, no skip (same work as TRL)", full["noskip_step_s"], trl, "", full["rss_mb"]),
        ("forge_nb LoRA, zero-advantage rows skipped", ours["step_s"], trl_lora, _accuracy(ours), ours["rss_mb"]),
        ("forge_nb LoRA, no skip (same work as TRL)", ours["noskip_step_s"], trl_lora, "", ours["rss_mb"]),
        ("TRL GRPOTrainer full", trl, trl, "", trl_full_rss),
        ("TRL GRPOTrainer + peft LoRA", trl_lora, trl_lora, "", trl_lora_rss),
    ]
    for name, seconds, baseline, accuracy, rss in rows:
        print(f"{name:<44}{seconds:>8.2f}{1 / seconds:>9.3f}{baseline / seconds:>7.2f}x{accuracy:>27}{rss:>13.0f}")


def _accuracy(run: dict) -> str:
    return f"{run['before']:.3f} -> {run['after']:.3f}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--minutes", type=float, default=5.0, help="forge_nb training time")
    parser.add_argument("--prompts", type=int, default=4)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--top", type=int, default=9, help="largest number in the problems (9: one-digit)")
    parser.add_argument("--max-tokens", type=int, default=48)
    parser.add_argument("--lr", type=float, default=2e-5)
    parser.add_argument("--train", type=int, default=400)
    parser.add_argument("--heldout", type=int, default=100)
    parser.add_argument("--engine", default="torch")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per forge_nb proc (TRL: 2)")
    parser.add_argument("--warmup", type=int, default=1, help="forge_nb steps left out of the timing")
    parser.add_argument("--noskip-steps", type=int, default=4)
    parser.add_argument("--trl-steps", type=int, default=6)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lora", action="store_true", help="also LoRA, in forge_nb and in TRL + peft")
    parser.add_argument("--rank", type=int, default=16)
    parser.add_argument("--lora-lr", type=float, default=2e-4)
    args = parser.parse_args()
    train, heldout = data(args)
    ours = forge_nb_run(args, train, heldout)
    torch.set_num_threads(args.threads)
    trl = trl_run(args, train)
    print(
        f"\n{MODEL}, word problems ({len(train)} train, {len(heldout)} held out), {args.prompts} prompts x "
        f"{args.group} samples per step, <= {args.max_tokens} new tokens, GRPO, lr {args.lr:g}, float32, "
        f"{args.threads} threads per proc\n"
    )
    print(
        f"held-out accuracy (greedy): {ours['before']:.3f} -> {ours['after']:.3f} after {ours['steps']} steps "
        f"({args.minutes:g} min); mean reward first 5 steps {ours['reward_first']:.3f} -> last 5 "
        f"{ours['reward_last']:.3f}\n"
    )
    table = [
        ("forge_nb (torch engine), zero-advantage rows skipped", ours["step_s"]),
        ("forge_nb, no skip (same work as TRL)", ours["noskip_step_s"]),
        ("TRL GRPOTrainer 1.16.0", trl),
    ]
    print(f"{'':<56}{'s/step':>8}{'steps/s':>9}{'vs TRL':>8}")
    for name, seconds in table:
        print(f"{name:<56}{seconds:>8.2f}{1 / seconds:>9.3f}{trl / seconds:>7.2f}x")
    print(f"\nsequences skipped by forge_nb's trainer (zero advantage): {ours['skipped_share']:.0%}")
    if args.lora:
        lora_table(args, train, heldout, ours, trl)


if __name__ == "__main__":
    main()
