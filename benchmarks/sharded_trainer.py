"""The sharded trainer: memory per rank and steps/s at 1 vs 2 trainer procs, and activation memory against
the micro-batch budget, on a random-init Llama of >= 0.5B parameters (the bundled recipe scaled up:
`forge_nb.tools.bundled_model.random_model`).

Both sides run forge_nb's own trainer code (`forge_nb.parallel.Policy`: FSDP2 on gloo at 2 procs, the
plain model at 1) on the same GRPO-shaped batch (P prompts x G completions, random tokens, group-centred
advantages), in fresh processes, one after the other, with the same total threads (2 at 1 proc, 1 each
at 2 procs). Measured per rank:

- state: bytes of parameters + gradients + AdamW state the rank holds (its shards at 2 procs), counted
  from the tensors (`parallel.training_state.rank_bytes`);
- peak RSS: the process's high-water resident memory (it includes loading the whole model from disk
  before sharding, the step's activations and gloo's buffers);
- activations: the peak of live tensors saved for backward during the step (a saved-tensors hook;
  parameters and views of them left out): what micro-batches bound;
- s/step: median wall time of an optimizer step (forward, backward, clip, AdamW) after a warm-up step.

    python benchmarks/sharded_trainer.py [--width 1536 --layers 16 --vocab 32000] [--prompts 2 --group 4]
        [--prompt-len 32 --completion-len 32] [--steps 2] [--budgets 160,96,64]
"""

from __future__ import annotations

import argparse
import dataclasses
import resource
import statistics
import tempfile
import time
from pathlib import Path

import torch

from forge_nb.config import AlgorithmConfig, TrainerConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.live.validate import check_loss_value
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.policy import Policy, PolicySpec
from forge_nb.testing.gang import run_gang
from forge_nb.tools.bundled_model import random_model
from forge_nb.tools.gpu_check.table import grpo_batch


class SavedActivations:
    """Live bytes of tensors autograd saves for backward (parameters excluded), and their peak."""

    def __init__(self) -> None:
        self.live = self.peak = 0
        self.storages: dict[int, list[int]] = {}  # storage pointer -> [holders, bytes]

    def __enter__(self) -> SavedActivations:
        self.hooks = torch.autograd.graph.saved_tensors_hooks(self.pack, lambda held: held.tensor)
        self.hooks.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.hooks.__exit__(*exc)

    def pack(self, tensor: torch.Tensor):
        root = tensor
        while root._base is not None:  # a view (a transposed weight): what it views
            root = root._base
        if root.is_leaf and root.requires_grad:  # a parameter (FSDP2's unsharded one included), or a view of one
            return _Held(tensor, None)
        return _Held(tensor, self)

    def add(self, ptr: int, nbytes: int) -> None:
        entry = self.storages.setdefault(ptr, [0, nbytes])
        if entry[0] == 0:
            self.live += nbytes
            self.peak = max(self.peak, self.live)
        entry[0] += 1

    def drop(self, ptr: int) -> None:
        entry = self.storages[ptr]
        entry[0] -= 1
        if entry[0] == 0:
            self.live -= entry[1]
            del self.storages[ptr]


class _Held:
    def __init__(self, tensor: torch.Tensor, meter: SavedActivations | None) -> None:
        self.tensor, self.meter = tensor, meter
        if meter is not None:
            storage = tensor.untyped_storage()
            self.ptr = storage.data_ptr()
            meter.add(self.ptr, storage.nbytes())

    def __del__(self) -> None:
        if self.meter is not None:
            self.meter.drop(self.ptr)


def rank_run(rank: int, world: int, model_dir: str, args: argparse.Namespace) -> dict:
    """One trainer rank: load, warm-up step, timed steps; at 1 proc also the micro-batch sweep."""
    sharded = world > 1
    gang = Gang.join(torch.device("cpu"), 1800.0) if sharded else Gang()
    spec = PolicySpec(model_dir, "float32", "cpu", 0, 1.0, TrainerConfig(), sharded, 1e-5)
    start = time.perf_counter()
    policy = Policy(spec, gang)
    load_s = time.perf_counter() - start
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=args.completion_len))
    batch = grpo_batch(args.prompts, args.group, args.prompt_len, args.completion_len, args.vocab)
    times, peak = [], 0
    for _ in range(args.steps + 1):
        start = time.perf_counter()
        with SavedActivations() as meter:
            policy.update(batch, loss_fn, 1.0, check_loss_value, True)
        times.append(time.perf_counter() - start)
        peak = max(peak, meter.peak)
    out = {
        "load_s": load_s,
        "s_per_step": statistics.median(times[1:]),
        "state_bytes": policy.sizes()["rank_state_bytes"],
        "params": policy.sizes()["total_params"],
        "peak_rss": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
        "activations": peak,
        "sweep": [],
    }
    if not sharded:
        for budget in [0, *args.budgets]:
            policy.spec = dataclasses.replace(spec, trainer=TrainerConfig(micro_batch_tokens=budget))
            start = time.perf_counter()
            with SavedActivations() as meter:
                metrics, _ = policy.update(batch, loss_fn, 1.0, check_loss_value, True)
            out["sweep"].append((budget, metrics["micro_batches"], meter.peak, time.perf_counter() - start))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--prompts", type=int, default=2)
    parser.add_argument("--group", type=int, default=4)
    parser.add_argument("--prompt-len", type=int, default=32)
    parser.add_argument("--completion-len", type=int, default=32)
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--budgets", default="160,96,64", help="micro_batch_tokens values for the sweep")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all (split over the procs)")
    args = parser.parse_args()
    args.budgets = [int(b) for b in args.budgets.split(",") if b]
    with tempfile.TemporaryDirectory(prefix="forge_nb_bench_") as folder:
        model = str(random_model(Path(folder), args.width, args.layers, args.vocab))
        (one,) = run_gang(1, rank_run, model, args, timeout=3600, threads=args.threads)
        two = run_gang(2, rank_run, model, args, timeout=3600, threads=max(1, args.threads // 2))
    report(one, two, args)


def report(one: dict, two: list[dict], args: argparse.Namespace) -> None:
    gb = 1e9
    tokens = args.prompts * args.prompt_len + args.prompts * args.group * args.completion_len
    print(
        f"\nmodel: random Llama {args.width} x {args.layers}, vocab {args.vocab}: {one['params'] / 1e9:.2f}B params, "
        f"float32, AdamW. Batch: {args.prompts} prompts x {args.group} completions, {args.prompt_len} + "
        f"{args.completion_len} tokens ({tokens} padded tokens a step, each prompt once). "
        f"{args.threads} threads in all."
    )
    head = ("procs", 5), ("rank", 4), ("state GB", 9), ("x 1 proc", 9), ("peak RSS GB", 12), ("activ. GB", 10)
    print("\n" + " ".join(f"{name:>{width}}" for name, width in head) + f" {'s/step':>8}")
    rows = [(1, 0, one)] + [(2, r, two[r]) for r in range(2)]
    for procs, rank, r in rows:
        ratio = r["state_bytes"] / one["state_bytes"]
        print(
            f"{procs:>5} {rank:>4} {r['state_bytes'] / gb:>9.2f} {ratio:>9.3f} {r['peak_rss'] / gb:>12.2f} "
            f"{r['activations'] / gb:>10.3f} {r['s_per_step']:>8.1f}"
        )
    speed = one["s_per_step"] / max(two[0]["s_per_step"], two[1]["s_per_step"])
    print(f"\nsteps/s at 2 procs / 1 proc: {speed:.2f}x (same {args.threads} cores; no goal on a CPU)")
    head = ("micro_batch_tokens", 18), ("micro-batches", 13), ("activations GB", 15), ("x whole batch", 14)
    print("\n" + " ".join(f"{name:>{width}}" for name, width in head) + f" {'s/step':>7}")
    whole = one["sweep"][0][2]
    for budget, count, peak, seconds in one["sweep"]:
        print(f"{budget or 'whole batch':>18} {count:>13} {peak / gb:>15.3f} {peak / whole:>14.2f} {seconds:>7.1f}")


if __name__ == "__main__":
    main()
