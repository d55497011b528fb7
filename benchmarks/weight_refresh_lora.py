"""A real model's weight refresh through forge_nb sessions, full fine-tuning vs a LoRA adapter, one run
(`weight_refresh.py --lora MODEL` runs it).

The table is a real model's refresh through forge_nb sessions (trainer ->
generator, the product's `s.sync()`): a full refresh (every weight) against a LoRA adapter refresh (only
the adapter's tensors: on the torch engine merged into its weights from an unmerged base, or copied into
peft layers; on vLLM loaded as its LoRA adapter), bytes and seconds per refresh (median of --refreshes,
after a first one that maps the buffers) and the rollout's seconds, in one run.

  python benchmarks/weight_refresh.py --lora smollm2-135m-instruct [--engines torch vllm] [--rank 16] [--refreshes 4]
"""

from __future__ import annotations

import os
import statistics
import time

from forge_nb.session import Session


def session_refresh(model: str, engine: str, lora: dict | None, refreshes: int) -> dict[str, float]:
    """One session on `model` with `engine` (full training, or a `lora` adapter): rollout, train, sync,
    `refreshes` + 1 times -> bytes per refresh, median seconds (transfer + load), transfer seconds and
    rollout seconds (what serving the adapter costs generation), the first refresh left out (it maps the
    publisher's buffers)."""

    extra = {"lora": lora} if lora else {}
    s = Session.up(model=model, engine=engine, prompts_per_step=2, group_size=2, max_tokens=8, lr=1e-5, **extra)
    try:
        reports, rollouts = [], []
        for _ in range(refreshes + 1):
            start = time.perf_counter()
            batch = s.rollout()
            rollouts.append(time.perf_counter() - start)
            s.train(batch)
            reports.append(s.sync())
        sizes = s.status()["trainer"]
    finally:
        s.down()
    later = reports[1:]
    return {
        "trainable_params": sizes["trainable_params"],
        "bytes": later[0]["bytes"],
        "seconds": statistics.median(r["seconds"] for r in later),
        "transfer_seconds": statistics.median(r["transfer_seconds"] for r in later),
        "rollout_seconds": statistics.median(rollouts[1:]),
    }


def lora_table(model: str, engines: list[str], rank: int, refreshes: int) -> None:
    """Print a full refresh against a rank-`rank` adapter refresh (every default target) of `model`, for each
    engine: the torch engine merged and as peft layers, vLLM as its LoRA adapter."""
    lora = {"r": rank, "alpha": 2 * rank}
    runs = []
    for engine in engines:
        runs.append((engine, "full (every weight)", None))
        if engine == "torch":
            runs += [
                (engine, f"LoRA r={rank}, merged", lora),
                (engine, f"LoRA r={rank}, layers", lora | {"serve": "layer"}),
            ]
        else:
            runs.append((engine, f"LoRA r={rank}, vLLM adapter", lora))
    rows = [(engine, name, session_refresh(model, engine, settings, refreshes)) for engine, name, settings in runs]
    print(f"\n{model}: weight refresh per s.sync(), median of {refreshes}, {os.cpu_count()} cores\n")
    head = ("trained params", "bytes", "seconds", "transfer s", "bytes/full", "s/full", "rollout s")
    print(f"{'engine':<8}{'':<26}" + "".join(f"{h:>15}" for h in head))
    for engine, name, r in rows:
        full = next(f for e, n, f in rows if e == engine and n.startswith("full"))
        print(
            f"{engine:<8}{name:<26}{r['trainable_params']:>15,}{r['bytes']:>15,}{r['seconds']:>15.4f}"
            f"{r['transfer_seconds']:>15.4f}{r['bytes'] / full['bytes']:>14.4f}x"
            f"{r['seconds'] / full['seconds']:>14.2f}x{r['rollout_seconds']:>15.2f}"
        )
