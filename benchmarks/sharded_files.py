"""A sharded trainer's HF directory in and out, shard by shard against whole: seconds and host memory per
rank, 2 trainer ranks (FSDP2 on gloo), on a random-init Llama of >= 0.5B parameters stored in bfloat16
(as hub checkpoints are) and in float32, trained in float32.

- load, by rows (forge_nb: `parallel.sharded_load.build`, what `Policy` runs): parameters on the meta device,
  FSDP2, then each rank reads only its own rows of the safetensors files;
  load, whole (forge_nb before, and what it still does for a directory without safetensors): every rank
  `from_pretrained`s the whole model, then FSDP2 keeps its shards (`fsdp.shard`), as the peers load.
- save, by rows (`parallel.sharded_save.write`): every rank writes its rows into the files, nothing gathered;
  save, whole (`parallel.training_state.whole_copy` + `save_pretrained`): the ranks gather every tensor to rank 0,
  which holds a whole copy and writes it, as `save_pretrained` on a sharded model does.

Both sides end with the same shards in memory and the same files on disk (checked: the saved tensors are
compared). Each (stored dtype, side) runs in fresh processes. Memory is sampled every 2 ms in each rank
(psutil): the peak above the rank's memory just before the phase, resident in all (RSS: file pages mapped
from the page cache count, and are shared between the ranks of a host) and anonymous (RssAnon: the rank's
own copies). Saving also syncs the files to disk (by rows: os.fsync; whole: safetensors does not, so the
bench syncs them after, inside the timing).

    python benchmarks/sharded_files.py [--width 1536 --layers 16 --vocab 32000] [--stored bfloat16,float32]
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import torch

from forge_nb.parallel import fsdp, sharded_load, sharded_save
from forge_nb.parallel import training_state as state
from forge_nb.parallel.gang import Gang
from forge_nb.parallel.safetensors_rows import stored_tensors
from forge_nb.testing.gang import run_gang
from forge_nb.tools.bundled_model import random_model


class PeakMemory:
    """The peak of this process's RSS and RssAnon above their values at entry, sampled every `every` s."""

    def __init__(self, every: float = 0.002) -> None:
        self.every, self.peak_rss, self.peak_anon = every, 0, 0

    @staticmethod
    def now() -> tuple[int, int]:
        fields = dict(line.split(":", 1) for line in Path("/proc/self/status").read_text().splitlines())
        return int(fields["VmRSS"].split()[0]) * 1024, int(fields["RssAnon"].split()[0]) * 1024

    def _sample(self) -> None:
        while not self._stop.is_set():
            rss, anon = self.now()
            self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)
            time.sleep(self.every)

    def __enter__(self) -> PeakMemory:
        self.base_rss, self.base_anon = self.now()
        self.peak_rss, self.peak_anon = self.base_rss, self.base_anon
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        rss, anon = self.now()
        self.peak_rss, self.peak_anon = max(self.peak_rss, rss), max(self.peak_anon, anon)

    @property
    def extra(self) -> tuple[int, int]:
        return self.peak_rss - self.base_rss, self.peak_anon - self.base_anon


def rank_run(rank: int, world: int, model_dir: str, by_rows: bool, out: str) -> dict:
    """One trainer rank: load the model (by rows or whole), then save it into `out` the same way."""
    from transformers import AutoModelForCausalLM

    gang = Gang.join(torch.device("cpu"), 1800.0)
    cpu = torch.device("cpu")
    shard = lambda m: fsdp.shard(m, gang)  # noqa: E731
    start = time.perf_counter()
    with PeakMemory() as load:
        if by_rows:
            model = sharded_load.build(model_dir, torch.float32, lambda m: m, shard, cpu, cpu)
        else:
            model = shard(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32))
    load_s = time.perf_counter() - start
    gang.sum_across(torch.zeros(1))  # both ranks loaded before either saves
    start = time.perf_counter()
    with PeakMemory() as save:
        if by_rows:
            sharded_save.write(model, gang, out)
        else:
            whole = state.whole_copy(model, gang)
            if whole is not None:
                whole.save_pretrained(out)
                for file in Path(out).glob("*.safetensors"):
                    with open(file, "rb+") as f:
                        os.fsync(f.fileno())
                del whole
            gang.sum_across(torch.zeros(1))  # the save is done when rank 0 has written
    save_s = time.perf_counter() - start
    return {"load_s": load_s, "load_mem": load.extra, "save_s": save_s, "save_mem": save.extra}


def saved_equal(a: str, b: str) -> bool:
    from safetensors.torch import load_file

    x, y = load_file(Path(a) / "model.safetensors"), load_file(Path(b) / "model.safetensors")
    return x.keys() == y.keys() and all(torch.equal(x[k], y[k]) for k in x)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--width", type=int, default=1536)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--stored", default="bfloat16,float32", help="dtypes the model is stored in")
    parser.add_argument("--reps", type=int, default=3, help="runs of each side (fresh processes each)")
    args = parser.parse_args()
    runs: dict[tuple[str, bool], list[list[dict]]] = {}
    equal = {}
    with tempfile.TemporaryDirectory(prefix="forge_nb_bench_") as folder:
        random = random_model(Path(folder) / "random", args.width, args.layers, args.vocab)
        params = sum(math.prod(t.shape) for t in stored_tensors(random).values())
        for stored in args.stored.split(","):
            model = Path(folder) / stored
            _store_as(random, model, getattr(torch, stored))
            for _ in range(args.reps):
                outs = {}
                for by_rows in (True, False):  # the two sides alternate, so drift hits both
                    outs[by_rows] = str(Path(folder) / f"out-{stored}-{by_rows}")
                    ranks = run_gang(2, rank_run, str(model), by_rows, outs[by_rows], timeout=3600)
                    runs.setdefault((stored, by_rows), []).append(ranks)
                equal[stored] = equal.get(stored, True) and saved_equal(outs[True], outs[False])
                for out in outs.values():
                    shutil.rmtree(out)
            shutil.rmtree(model)
    report(runs, equal, params, args)


def _store_as(source: Path, out: Path, dtype: torch.dtype) -> None:
    from transformers import AutoModelForCausalLM

    AutoModelForCausalLM.from_pretrained(source, dtype=dtype).save_pretrained(out)


def _median_max(reps: list[list[dict]], key: str, index: int | None = None) -> tuple[float, float, float]:
    """Over the reps, the slower (larger) rank's value: (median, min, max)."""
    values = [max(r[key] if index is None else r[key][index] for r in ranks) for ranks in reps]
    return statistics.median(values), min(values), max(values)


def report(runs: dict, equal: dict, params: int, args: argparse.Namespace) -> None:
    gb = 1e9
    print(
        f"\nmodel: random Llama {args.width} x {args.layers}, vocab {args.vocab}: {params / 1e9:.2f}B params, "
        f"trained in float32 ({params * 4 / gb:.2f} GB; a rank's shards {params * 2 / gb:.2f} GB). 2 ranks, "
        f"gloo, 1 thread each; {args.reps} runs of each side: median (min-max) of the slower rank. Memory: the "
        "peak above the rank's own before the phase, anonymous (its own copies) and resident (with the file's "
        "mapped pages)."
    )
    print(f"\n{'stored':<9} {'side':<8} {'load s':>16} {'anon GB':>8} {'RSS GB':>7} {'save s':>17} {'anon GB':>8}")
    for (stored, by_rows), reps in runs.items():
        load, save = _median_max(reps, "load_s"), _median_max(reps, "save_s")
        print(
            f"{stored:<9} {'by rows' if by_rows else 'whole':<8} {_range(load):>16} "
            f"{_median_max(reps, 'load_mem', 1)[0] / gb:>8.2f} {_median_max(reps, 'load_mem', 0)[0] / gb:>7.2f} "
            f"{_range(save):>17} {_median_max(reps, 'save_mem', 1)[0] / gb:>8.2f}"
        )
    for stored, same in equal.items():
        rows, whole = runs[(stored, True)], runs[(stored, False)]
        load = _median_max(whole, "load_s")[0] / _median_max(rows, "load_s")[0]
        save = _median_max(whole, "save_s")[0] / _median_max(rows, "save_s")[0]
        print(f"stored {stored}: by rows loads {load:.2f}x and saves {save:.2f}x as fast; files equal: {same}")


def _range(value: tuple[float, float, float]) -> str:
    return f"{value[0]:.1f} ({value[1]:.1f}-{value[2]:.1f})"


if __name__ == "__main__":
    main()
