"""tinker-cookbook's recipes, unchanged, against a forge_nb session's Tinker API: its RL training
(`tinker_cookbook.recipes.math_rl.train`, the arithmetic environment: nothing downloaded) and its supervised
training (`tinker_cookbook.supervised.train` on the conversations file it ships in example_data/), on
SmolLM2-135M-Instruct with LoRA. Prints, for each, the reward (RL) or the loss (SL) of the first and last steps,
the steps and the wall time, read from the cookbook's own metrics.jsonl.

    python benchmarks/tinker_cookbook.py rl --steps 30
    python benchmarks/tinker_cookbook.py sl --steps 16

The session is a script's (`forge_nb.up`, its own server; it goes down at the end): a notebook can attach to it
while the recipe runs (`forge_nb.attach("tinker-rl-<pid>")`, `%forge dashboard`). The recipe runs as a child process
with TINKER_BASE_URL and TINKER_API_KEY from `s.serve_tinker()`, the model given as its local folder (what the
cookbook's tokenizer loads offline) and the renderer `qwen3_instruct` (SmolLM2's chat format is ChatML).
tinker-cookbook 0.6.1 installs with ``pip install --no-deps tinker-cookbook==0.6.1`` plus its dependencies
(docs/guides/tinker.md lists them).

`tinker_cookbook.supervised.train`'s own ``__main__`` fails in 0.6.1 (chz refuses its lambda entry point), so the
SL run calls its `main(Config)` from a few lines here, as the cookbook's README does in Python.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import forge_nb

RENDERER = "qwen3_instruct"
SL_DRIVER = """
import asyncio, json, os, sys
import tinker_cookbook
from tinker_cookbook.renderers import TrainOnWhat
from tinker_cookbook.supervised import train
from tinker_cookbook.supervised.data import FromConversationFileBuilder
from tinker_cookbook.supervised.types import ChatDatasetBuilderCommonConfig

a = json.loads(sys.argv[1])
data = os.path.join(os.path.dirname(tinker_cookbook.__file__), "example_data", "conversations.jsonl")
common = ChatDatasetBuilderCommonConfig(
    model_name_for_tokenizer=a["model"], renderer_name=a["renderer"], max_length=512, batch_size=a["batch"],
    train_on_what=TrainOnWhat.ALL_ASSISTANT_MESSAGES,
)
config = train.Config(
    log_path=a["log_path"], model_name=a["model"], renderer_name=a["renderer"], recipe_name="forge_nb",
    dataset_builder=FromConversationFileBuilder(common_config=common, file_path=data),
    learning_rate=a["lr"], lora_rank=a["rank"], base_url=os.environ["TINKER_BASE_URL"], save_every=0,
    eval_every=0, max_steps=a["steps"],
)
asyncio.run(train.main(config))
"""


def run_rl(model_dir: str, log_path: Path, args) -> list[str]:
    return [
        sys.executable, "-m", "tinker_cookbook.recipes.math_rl.train",
        "env=arithmetic", f"model_name={model_dir}", f"renderer_name={RENDERER}",
        f"base_url={os.environ['TINKER_BASE_URL']}", "loss_fn=importance_sampling",
        f"group_size={args.group_size}", f"groups_per_batch={args.groups}", f"max_tokens={args.max_tokens}",
        f"lora_rank={args.rank}", f"learning_rate={args.lr}", f"max_steps={args.steps}",
        "eval_every=0", "save_every=0", f"log_path={log_path}", "behavior_if_log_dir_exists=delete",
    ]  # fmt: skip


def run_sl(model_dir: str, log_path: Path, args) -> list[str]:
    driver = log_path.parent / "sl_driver.py"
    driver.write_text(SL_DRIVER)
    given = {"model": model_dir, "renderer": RENDERER, "log_path": str(log_path), "steps": args.steps,
             "batch": args.batch, "lr": args.lr, "rank": args.rank}  # fmt: skip
    return [sys.executable, str(driver), json.dumps(given)]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("recipe", choices=["rl", "sl"])
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--rank", type=int, default=8, help="LoRA rank")
    parser.add_argument("--lr", type=float, default=None, help="default: 1e-4 (RL), 2e-4 (SL)")
    parser.add_argument("--groups", type=int, default=8, help="RL: groups per batch")
    parser.add_argument("--group-size", type=int, default=8, help="RL: samples per group")
    parser.add_argument("--max-tokens", type=int, default=8, help="RL: tokens per sample")
    parser.add_argument("--batch", type=int, default=8, help="SL: conversations per step")
    parser.add_argument("--threads", type=int, default=2, help="torch threads per proc")
    # SmolLM2's vocabulary is 49152: a forward of 3500 tokens holds ~0.7 GB of logits per copy, and a trainer of
    # one micro-batch of 64 x 55 tokens reached 6 GB; micro-batches of 1024 tokens stay near 2 GB
    parser.add_argument("--micro-batch-tokens", type=int, default=1024, help="trainer.micro_batch_tokens")
    parser.add_argument("--model", default="smollm2-135m-instruct")
    args = parser.parse_args()
    args.lr = args.lr or (1e-4 if args.recipe == "rl" else 2e-4)

    start = time.perf_counter()
    s = forge_nb.up(
        name=f"tinker-{args.recipe}-{os.getpid()}", persist=False, model=args.model, lora={"r": args.rank},
        threads_per_proc=args.threads, micro_batch_tokens=args.micro_batch_tokens,
    )  # fmt: skip
    up_s = time.perf_counter() - start
    tinker = s.serve_tinker()
    model_dir = str(s.config.model.resolved_path())
    os.environ.update(tinker.env(), HF_HUB_OFFLINE="1", TINKER_TELEMETRY="0", TOKENIZERS_PARALLELISM="false")
    with tempfile.TemporaryDirectory() as scratch:
        log_path = Path(scratch) / "log"
        command = (run_rl if args.recipe == "rl" else run_sl)(model_dir, log_path, args)
        print(f"forge_nb: session up in {up_s:.0f} s; running the cookbook's {args.recipe.upper()} recipe", flush=True)
        begin = time.perf_counter()
        subprocess.run(command, check=True)
        wall = time.perf_counter() - begin
        rows = [json.loads(line) for line in (log_path / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = s.metrics[s.metrics.kind == "step"] if "kind" in s.metrics else None
    key = "env/all/reward/total" if args.recipe == "rl" else "train_mean_nll"
    values = [r[key] for r in rows if key in r]
    print(f"\ncookbook {args.recipe.upper()} on {args.model}, LoRA rank {args.rank}, lr {args.lr:g}")
    print(f"  {key}: first step {values[0]:.4f}, last step {values[-1]:.4f} over {len(values)} steps")
    if len(values) >= 10:
        head, tail = values[: len(values) // 5 or 1], values[-(len(values) // 5 or 1) :]
        print(f"  mean of the first fifth {sum(head) / len(head):.4f}, of the last fifth {sum(tail) / len(tail):.4f}")
    print(f"  wall time of the recipe {wall:.0f} s ({wall / max(1, len(values)):.1f} s/step); session up {up_s:.0f} s")
    if steps is not None:
        print(f"  the session saw {len(steps)} steps (mode {set(steps['mode'])}), policy v{s.trainer_version}")
    print(f"  refreshes listed by versions('policy'): {len(s.versions('policy'))}")
    s.down()


if __name__ == "__main__":
    main()
