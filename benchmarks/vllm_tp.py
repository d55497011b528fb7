"""vLLM at tensor_parallel_size 1 and 2: a refresh's load and generation, side by side on one model.

Each side is a fresh process (one vLLM engine a process) serving the same random-init Llama (the bundled
architecture scaled up, `forge_nb.tools.bundled_model.random_model`) in float32 through forge_nb's
`VllmEngine`: `--loads` times `load_weights` of the model's own tensors scaled by a different factor each
time (what a refresh hands the engine after its checks: one rank reads them in its process; two ranks read
views of a memory file the generator writes them to, `forge_nb/engines/vllm_tp.py`), then greedy
generation of `--prompts` x `--tokens` tokens. Both sides do the same work. On a CPU the two ranks share the
cores: generation there says what TP costs on shared cores, not what it gains on GPUs.

    python benchmarks/vllm_tp.py [--width 1024] [--layers 8] [--vocab 32000] [--loads 5]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path


def side(model: str, tp: int, loads: int, prompts: int, tokens: int) -> dict:
    """One engine at `tp`: seconds of each load, and generated tokens per second."""
    import torch
    from safetensors.torch import load_file

    from forge_nb.engines.base import SamplingParams
    from forge_nb.engines.vllm_engine import VllmEngine

    start = time.perf_counter()
    engine = VllmEngine.load(model, torch.float32, max_model_len=1024, tensor_parallel_size=tp)
    started = time.perf_counter() - start
    weights = load_file(str(Path(model) / "model.safetensors"))
    seconds = []
    for i in range(loads):
        scaled = [(name, t * (1.0 - 0.01 * (i + 1))) for name, t in weights.items()]
        t0 = time.perf_counter()
        engine.load_weights(scaled)
        seconds.append(time.perf_counter() - t0)
    ids = [engine.tokenizer(f"{i}+{i}=")["input_ids"] for i in range(prompts)]
    t0 = time.perf_counter()
    out = engine.generate(ids, SamplingParams(n=1, temperature=0.0, max_tokens=tokens, seed=0))
    generated = sum(len(c[0].token_ids) for c in out)
    nbytes = sum(t.numel() * t.element_size() for t in weights.values())
    tokens_per_s = generated / (time.perf_counter() - t0)
    return {"start_s": started, "load_s": seconds, "tokens_per_s": tokens_per_s, "bytes": nbytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--loads", type=int, default=5)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--side", default="", help=argparse.SUPPRESS)  # internal: "MODEL,TP"
    args = parser.parse_args()
    if args.side:  # as a generator proc of a session: torch's threads set before its import (mesh.threads_per_proc)
        os.environ.setdefault("OMP_NUM_THREADS", str(len(os.sched_getaffinity(0))))
        model, tp = args.side.rsplit(",", 1)
        print(json.dumps(side(model, int(tp), args.loads, args.prompts, args.tokens)))
        return
    from forge_nb.tools.bundled_model import random_model

    folder = Path(tempfile.mkdtemp(prefix="forge_nb_bench_"))
    runs = {}
    try:
        model = random_model(folder, args.width, args.layers, args.vocab)
        for tp in (1, 2):
            command = [sys.executable, __file__, "--side", f"{model},{tp}", "--loads", str(args.loads)]
            command += ["--prompts", str(args.prompts), "--tokens", str(args.tokens)]
            done = subprocess.run(command, capture_output=True, text=True, check=True)
            runs[tp] = json.loads(done.stdout.strip().splitlines()[-1])
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    gb = runs[1]["bytes"] / 1e9
    print(f"\nrandom Llama {args.width} x {args.layers}, vocab {args.vocab}: {gb:.2f} GB f32; n = {args.loads} loads")
    print(f"{'':<24}{'TP 1':>18}{'TP 2':>18}{'TP 2 / TP 1':>14}")
    load = {tp: runs[tp]["load_s"] for tp in runs}
    cells = "".join(f"{statistics.mean(v):>11.3f} ± {statistics.stdev(v):<5.3f}" for v in load.values())
    print(f"{'load_weights (s)':<24}{cells}{statistics.mean(load[2]) / statistics.mean(load[1]):>13.2f}x")
    gbps = {tp: gb / statistics.mean(v) for tp, v in load.items()}
    print(f"{'load (GB/s)':<24}{gbps[1]:>18.2f}{gbps[2]:>18.2f}{gbps[2] / gbps[1]:>13.2f}x")
    tps = {tp: runs[tp]["tokens_per_s"] for tp in runs}
    print(f"{'greedy tokens/s':<24}{tps[1]:>18.1f}{tps[2]:>18.1f}{tps[2] / tps[1]:>13.2f}x")
    print(f"{'engine start (s)':<24}{runs[1]['start_s']:>18.1f}{runs[2]['start_s']:>18.1f}")


if __name__ == "__main__":
    main()
