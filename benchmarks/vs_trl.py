"""GRPO steps/s: forge_nb vs TRL's GRPOTrainer, same model, task, batch and completion length.

Both sides: the bundled model, the addition task with its exact verifier as the only reward,
P prompts x G samples per optimizer step, at most `max_tokens` new tokens, temperature 1, the GRPO loss
(sequence-level, ratio clip 0.2, group-normalised advantages, no KL), AdamW at the same learning rate,
grad-norm clip 1.0, float32 on the CPU (the ratios are against TRL in float32; its default, bf16 autocast
even on the CPU, is one more row). TRL runs in this process (HF `generate`, its default without vLLM);
forge_nb runs its mesh (generator, trainer and reward procs) with each engine, and in async mode; its trainer
leaves zero-advantage sequences out of the forward/backward (same loss and update, tested). Each side gets
`--warmup` steps that are not timed, then `--steps` timed steps. Needs `pip install -e '.[bench]'`
(`make bench-deps`).

    python benchmarks/vs_trl.py [--steps 60] [--warmup 5] [--prompts 32] [--group 8] [--max-tokens 6]
"""

from __future__ import annotations

import argparse
import time

import torch
from trl_baseline import grpo_config, step_clock

from forge_nb.config import TaskConfig
from forge_nb.engines.vllm_engine import vllm_available
from forge_nb.models import BUNDLED_MODEL
from forge_nb.session import Session
from forge_nb.tasks import make_task


def forge_steps_per_s(engine: str, mode: str, args: argparse.Namespace) -> tuple[float, float]:
    """-> (steps/s over the timed steps, median trainer seconds per step)."""
    threads = args.threads if mode == "sync" else 1  # async: generator and trainer share the cores
    s = Session.up(
        engine=engine,
        prompts_per_step=args.prompts,
        group_size=args.group,
        max_tokens=args.max_tokens,
        threads_per_proc=threads,
        lr=args.lr,
        loss="grpo",
    )
    try:
        if mode == "sync":
            s.step(args.warmup, progress=False)
            start = time.perf_counter()
            timed = s.step(args.steps, progress=False)
            return args.steps / (time.perf_counter() - start), float(timed.train_s.median())
        run = s.run(args.warmup + args.steps, mode="async", max_staleness=1)
        run.wait()
        steps = s.metrics_stream.to_pandas("step")
        ends = steps.time.to_numpy()[args.warmup - 1 :]  # from the end of the last warm-up step
        return (len(ends) - 1) / (ends[-1] - ends[0]), float(steps.train_s.iloc[args.warmup :].median())
    finally:
        s.down()


def trl_steps_per_s(args: argparse.Namespace, bf16: bool = False) -> float:
    """TRL's steps/s; `bf16=True` is GRPOConfig's default (autocast, on the CPU too)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOTrainer

    task = make_task(TaskConfig(), seed=1)
    problems = task.sample(args.prompts * (args.warmup + args.steps + 1))
    dataset = Dataset.from_dict({"prompt": [p.prompt for p in problems], "target": [p.target for p in problems]})

    def reward(completions: list[str], target: list[str], **_) -> list[float]:
        return [task.verify(c, t) for c, t in zip(completions, target)]

    config = grpo_config(
        "/tmp/forge_nb_vs_trl",
        args.prompts * args.group,
        args.group,
        args.max_tokens,
        args.lr,
        args.warmup + args.steps,
        bf16=bf16,
    )
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL), dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL))
    times = step_clock()
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=reward,
        args=config,
        train_dataset=dataset,
        processing_class=tokenizer,
        callbacks=[times],
    )
    trainer.train()
    timed = times.times[args.warmup - 1 :]  # from the end of the last warm-up step
    return (len(timed) - 1) / (timed[-1] - timed[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=60)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=32)
    parser.add_argument("--group", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--threads", type=int, default=2, help="torch threads per forge_nb proc (TRL: all cores)")
    parser.add_argument("--lr", type=float, default=5e-4)
    args = parser.parse_args()
    engines = ["torch"] + (["vllm"] if vllm_available() else [])
    runs = [(e, "sync") for e in engines] + [("torch", "async")]
    rates, train_s = {}, {}
    for engine, mode in runs:
        name = f"forge_nb {engine} engine" + (", async" if mode == "async" else "")
        rates[name], train_s[name] = forge_steps_per_s(engine, mode, args)
    torch.set_num_threads(2)
    rates["TRL GRPOTrainer 1.16.0"] = trl = trl_steps_per_s(args)
    rates["TRL, its default bf16 autocast"] = trl_steps_per_s(args, bf16=True)
    print(
        f"\nbundled model, addition task, {args.prompts} prompts x {args.group} samples per step, "
        f"<= {args.max_tokens} new tokens, GRPO loss, float32 CPU; {args.steps} timed steps after {args.warmup} "
        "warm-up; async: max staleness 1, 1 thread per proc\n"
    )
    print(f"{'':<32}{'steps/s':>10}{'vs TRL':>9}{'train s/step':>14}")
    for name, rate in rates.items():
        train = f"{train_s[name]:>14.4f}" if name in train_s else ""
        print(f"{name:<32}{rate:>10.2f}{rate / trl:>8.2f}x{train}")
    floor = train_s["forge_nb torch engine"]
    # Both sides run the same forward + backward + AdamW on the same batch: even with generation free,
    # a step cannot be shorter than that.
    print(f"\nceiling vs TRL if generation cost nothing: {1 / floor / trl:.2f}x (trainer alone: {floor:.4f} s/step)")


if __name__ == "__main__":
    main()
