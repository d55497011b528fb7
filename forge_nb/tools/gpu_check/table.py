"""The rows of `make gpu-check`'s table, how a row's numbers are measured, and the batch every part uses."""

from __future__ import annotations

import dataclasses
import gc
import statistics
import time
import traceback
from collections.abc import Callable

import torch

GiB = 1 << 30


@dataclasses.dataclass
class Row:
    """One line of the table: what ran, and its numbers (nan: not measured)."""

    part: str
    what: str
    seconds: float = float("nan")
    rate: float = float("nan")  # tokens/s, or GB/s for a refresh
    unit: str = ""
    memory_gib: float = float("nan")
    check: str = ""


def measure(fn: Callable[[], object], repeats: int) -> tuple[float, float]:
    """Median seconds of `repeats` calls after one warm-up, and peak GPU memory (GiB) over them (nan
    without a GPU: the CPU smoke run)."""
    gpu = torch.cuda.is_available()
    fn()
    sync()
    if gpu:
        torch.cuda.reset_peak_memory_stats()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        sync()
        times.append(time.perf_counter() - start)
    return statistics.median(times), torch.cuda.max_memory_allocated() / GiB if gpu else float("nan")


def sync() -> None:
    """Wait for the GPU's queued work (the timings' end), where there is one."""
    if torch.cuda.is_available():
        torch.cuda.synchronize()


def grpo_batch(prompts: int, group: int, prompt_len: int, completion_len: int, vocab: int, seed: int = 0):
    """A GRPO-shaped `rl.batch.TrainBatch`: P random prompts x G random completions, advantages centred per
    group, behaviour logprobs -10 (the ratio is clipped: a real update's shape)."""
    from forge_nb.rl.batch import TrainBatch

    gen = torch.Generator().manual_seed(seed)
    p_ids, c_ids, advantages = [], [], []
    for _ in range(prompts):
        prompt = torch.randint(3, vocab, (prompt_len,), generator=gen).tolist()
        adv = torch.randn(group, generator=gen)
        for a in (adv - adv.mean()).tolist():
            p_ids.append(prompt)
            c_ids.append(torch.randint(3, vocab, (completion_len,), generator=gen).tolist())
            advantages.append(a)
    logprobs = [[-10.0] * completion_len for _ in c_ids]
    return TrainBatch(p_ids, c_ids, logprobs, advantages, keep_logprobs=False)


def free() -> None:
    """Give the GPU memory of what was dropped back (between rows: each row's peak is its own)."""
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def print_table(rows: list[Row], header: str) -> None:
    print("\n" + header)
    print(f"{'part':<10} {'what':<36} {'s':>8} {'rate':>12} {'unit':<6} {'peak GiB':>9}  check")
    for r in rows:
        print(
            f"{r.part:<10} {r.what:<36} {r.seconds:>8.3f} {r.rate:>12,.1f} {r.unit:<6} {r.memory_gib:>9.1f}  {r.check}"
        )


def run_part(part: Callable[..., list[Row]], *args) -> list[Row]:
    """`part`'s rows, or one FAILED row with its error (its traceback printed): the other parts still run,
    so one run on a lent GPU shows everything that works and everything that does not."""
    try:
        return part(*args)
    except Exception as e:
        traceback.print_exc()
        free()
        return [Row("FAILED", part.__name__, check=f"{type(e).__name__}: {e}"[:300])]
