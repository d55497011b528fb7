"""`make gpu-check`: forge_nb's GPU code run for real on a GPU machine, one table.

The default mode needs only PyTorch with CUDA and transformers (no Monarch, no vLLM, no network): the
product's Monarch-free modules driven directly, on a random-init Llama the bundled recipe builds at a
size where GPU numbers mean something (`tools.bundled_model.random_model`: 1536 x 16, vocab 32000,
0.59B parameters):

- trainer (`parallel.Policy`): a GRPO step on CUDA, plain and under FSDP2 at world size 1 (the same
  loss and gradient norm), FSDP2 with bf16 mixed precision, then micro-batches, then activation
  checkpointing: s/step, tokens/s, peak GPU memory;
- files (`parallel.sharded_load`, `parallel.sharded_save`): the FSDP2 policy's load of the model directory
  by rows into its GPU shards, and its save by rows from them (GB/s; the saved tensors equal the trainer's);
- generator (`engines.TorchEngine` on CUDA): sampled tokens/s, and the sampled tokens' logprobs against
  the trainer's logprobs of the same tokens (same weights: the difference is kernels and dtype);
- refresh (`weights.publish` -> `weights.refresh`, `gpu_check.refresh`): trainer to a generator in
  another process, CUDA IPC against the host-staged path (/dev/shm), and a refresh overlapping a step;
  the "group" transport's NCCL group, as far as one GPU allows (a group of one).

``--full`` runs the whole stack instead (Monarch mesh, vLLM's GPU engine, a few GRPO steps of
SmolLM2-135M-Instruct): a GPU node with everything installed. Without a GPU it says so and exits 0.

    python -m forge_nb.tools.gpu_check [--width 1536 --layers 16 --vocab 32000] [--steps 3] [--full]
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import torch


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=128)
    parser.add_argument("--completion-len", type=int, default=384)
    parser.add_argument("--micro", type=int, default=8192, help="trainer.micro_batch_tokens of the micro-batch rows")
    parser.add_argument("--steps", type=int, default=3, help="timed repeats (after one warm-up)")
    parser.add_argument("--reps", type=int, default=3, help="refreshes per transport")
    parser.add_argument("--full", action="store_true", help="the whole stack: mesh, vLLM, SmolLM2 (a GPU node)")
    parser.add_argument("--device", default="cuda", help="cpu: run the same code without a GPU (this tool's own test)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    from transformers.utils import logging as transformers_logging

    transformers_logging.disable_progress_bar()  # a bar per model load, a dozen of them, around the table
    if args.device == "cuda" and not torch.cuda.is_available():
        print("gpu-check: no CUDA device here (torch.cuda.is_available() is False); nothing to check")
        return 0
    if args.full:
        from forge_nb.tools.gpu_check.full import run_full

        return run_full(args)
    from forge_nb.engines import weights_bytes
    from forge_nb.tools.bundled_model import random_model
    from forge_nb.tools.gpu_check.parts import generator_rows, trainer_rows
    from forge_nb.tools.gpu_check.refresh import nccl_rows, refresh_rows
    from forge_nb.tools.gpu_check.table import print_table, run_part

    gpu = torch.cuda.get_device_name(0) if args.device == "cuda" else "the CPU (a smoke run: no GPU numbers)"
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="forge_nb_gpu_check_") as folder:
        model_dir = str(random_model(Path(folder), args.width, args.layers, args.vocab))
        params = weights_bytes(Path(model_dir)) / 4 / 1e9  # float32 files
        parts = (trainer_rows, generator_rows, refresh_rows, nccl_rows)
        rows = [row for part in parts for row in run_part(part, model_dir, args)]
    batch = f"{args.prompts * args.group} x ({args.prompt_len} + {args.completion_len}) tokens"
    print_table(
        rows,
        f"gpu-check on {gpu}, torch {torch.__version__}: random Llama {args.width} x {args.layers}, vocab "
        f"{args.vocab} ({params:.2f}B params); GRPO batch {batch}; {time.perf_counter() - start:.0f} s in all",
    )
    return 1 if any(r.part == "FAILED" for r in rows) else 0
