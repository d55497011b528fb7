"""Generation engines side by side: generated tokens/s of vLLM vs the plain-torch engine.

Same bundled model, same prompts, same sampling (n samples per prompt, temperature 1, max tokens),
float32, in this one process. Each engine gets a warm-up batch first (vLLM's first batch pays its
lazy initialisation), then `--repeats` timed batches per batch size; the median is reported. Tokens
counted are those actually generated (EOS included), so an engine that stops early is not favoured.
The torch engine runs first: vLLM pins torch to 1 intra-op thread in the process once it starts.

    python benchmarks/engines.py [--threads 2] [--repeats 5] [--max-tokens 6] [--model DIR | --random WIDTH,LAYERS]
    python benchmarks/engines.py --model smollm2-135m-instruct --chat --max-tokens 48 --batches 4x4,8x8,16x8

`--model` takes a directory or a registered name; `--chat` sends word problems through the model's chat
template (a real instruct model's prompts) instead of the bundled addition prompts.

`--random 1024,8` serves a randomly initialised Llama of that width and depth (bundled tokenizer) instead
of the bundled 128-wide, 2-layer model: on a model that small vLLM's per-request scheduling in Python,
not the matmuls, sets the pace.
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import AutoTokenizer

from forge_nb.config import TaskConfig
from forge_nb.engines.base import SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.models import resolve_model
from forge_nb.tasks import make_task
from forge_nb.tasks.base import Problem
from forge_nb.tasks.prompts import PromptFormat
from forge_nb.tasks.word_problems import word_problems
from forge_nb.tools.bundled_model import random_model

BATCHES = "8x8,32x8,128x8"  # prompts x samples per prompt


def tokens_per_s(engine, prompts: list, sampling: SamplingParams, repeats: int) -> float:
    engine.generate(prompts[:2], sampling)  # warm-up
    rates = []
    for i in range(repeats):
        start = time.perf_counter()
        out = engine.generate(prompts, dataclasses.replace(sampling, seed=i))
        elapsed = time.perf_counter() - start
        rates.append(sum(len(c.token_ids) for group in out for c in group) / elapsed)
    return statistics.median(rates)


def measure(engine, batches: dict, max_tokens: int, repeats: int) -> dict:
    return {
        (p, n): tokens_per_s(engine, prompts, SamplingParams(n=n, max_tokens=max_tokens), repeats)
        for (p, n), prompts in batches.items()
    }


def prompt_ids(model: Path, count: int, chat: bool) -> list[list[int]]:
    """Token ids of `count` prompts: the bundled addition task's, or word problems as the model's chat
    template renders them."""
    tokenizer = AutoTokenizer.from_pretrained(str(model))
    if chat:
        rows = word_problems(count, seed=1)
        problems = [Problem(str(i), r["prompt"], r["answer"]) for i, r in enumerate(rows)]
    else:
        problems = make_task(TaskConfig(), seed=1).sample(count)
    return PromptFormat(tokenizer).render_all(problems)[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--threads", type=int, default=2, help="torch threads for the torch engine")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--max-tokens", type=int, default=6)
    parser.add_argument("--model", default="bundled", help="HF model directory or registered name (default: bundled)")
    parser.add_argument("--random", default=None, metavar="WIDTH,LAYERS", help="serve a random-init Llama this size")
    parser.add_argument("--chat", action="store_true", help="word problems through the chat template")
    parser.add_argument("--batches", default=BATCHES, help=f"PROMPTSxN,... (default {BATCHES})")
    args = parser.parse_args()
    sizes = [tuple(int(x) for x in b.split("x")) for b in args.batches.split(",")]
    label = args.model
    args.model = resolve_model(args.model)
    if args.random:
        width, layers = (int(x) for x in args.random.split(","))
        args.model, label = random_model(Path(tempfile.mkdtemp(prefix="forge_nb_bench_")), width, layers), args.random
    batches = {size: prompt_ids(args.model, size[0], args.chat) for size in sizes}

    torch.set_num_threads(args.threads)
    torch_engine = TorchEngine.load(args.model)
    torch_rates = measure(torch_engine, batches, args.max_tokens, args.repeats)
    params = sum(p.numel() for p in torch_engine.model.parameters())

    from forge_nb.engines.vllm_engine import VllmEngine

    start = time.perf_counter()
    vllm = VllmEngine.load(args.model, torch.float32, seed=0)
    vllm_start = time.perf_counter() - start
    vllm_rates = measure(vllm, batches, args.max_tokens, args.repeats)

    name = f"random {label}" if args.random else label
    print(
        f"\nmodel {name} ({params / 1e6:.1f}M params), float32, temperature 1, max {args.max_tokens} new tokens, "
        f"{args.threads} torch threads (torch engine); vLLM start incl. warm-up {vllm_start:.1f} s; "
        f"median of {args.repeats} batches\n"
    )
    print(f"{'prompts x n':>12}{'torch tok/s':>14}{'vLLM tok/s':>14}{'vLLM/torch':>12}")
    for key in sizes:
        ratio = vllm_rates[key] / torch_rates[key]
        print(f"{f'{key[0]} x {key[1]}':>12}{torch_rates[key]:>14.0f}{vllm_rates[key]:>14.0f}{ratio:>11.2f}x")
    if args.random:
        shutil.rmtree(args.model)


if __name__ == "__main__":
    main()
