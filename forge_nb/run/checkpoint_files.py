"""Checkpoints: everything a session needs to go on exactly where it was, in one folder.

    PATH/
      checkpoint.json   what this is: step, policy versions, counters, the task stream's state, time
      config.yaml       the session's configuration
      data/             a dataset given in memory: train.jsonl, eval.jsonl (a task.path file is not copied)
      trainer/          the trainer's weights (HF directory), trainer_state.pt (optimizer, RNG, version)
      generator/        the weights the generator serves, when they are not the trainer's (synced: absent)
      live.json         every reward and loss version: source, members, weights, status
      buffer.jsonl      the replay buffer's episodes; buffer_ids.json, every sample id ever added
      metrics.jsonl     the metrics stream

A checkpoint is written under a temporary name and renamed into place, so a folder that exists is
complete. This module reads and writes files; `forge_nb.run.checkpoints` gathers the state of a session
and the actors write their own weights.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import yaml

from forge_nb.rl.episode import Episode
from forge_nb.tasks.dataset import ROW_ANSWER, ROW_ID, ROW_PROMPT

FORMAT = 1
PERIODIC = "step-{step:08d}"


@dataclass
class Checkpoint:
    """A checkpoint read back: `state` is checkpoint.json (step, versions, counters, task state)."""

    path: Path
    state: dict
    config: dict
    data: dict[str, list[dict]] | None
    live: dict
    episodes: list[Episode]
    sample_ids: list[int]
    metrics: list[dict]

    @property
    def step(self) -> int:
        return self.state["step_count"]

    def session_config(self) -> dict:
        """The config to go on with: rows kept in data/ were written under `DatasetTask.rows`' names."""
        if self.data is None:
            return self.config
        names = {"prompt_column": ROW_PROMPT, "answer_column": ROW_ANSWER, "id_column": ROW_ID}
        return {**self.config, "task": {**self.config["task"], **names}}

    @property
    def trainer_dir(self) -> Path:
        return self.path / "trainer"

    @property
    def generator_dir(self) -> Path:
        """The served weights: their own folder when they differ from the trainer's."""
        own = self.path / "generator"
        return own if own.is_dir() else self.trainer_dir


def write(
    path: str | Path,
    state: dict,
    config: dict,
    data: dict[str, list[dict]] | None,
    live: dict,
    episodes: list[Episode],
    sample_ids: list[int],
    metrics: list[dict],
    save_weights: Callable[[Path], None],
) -> Path:
    """Write a checkpoint at `path` (replacing one there) -> its path. `save_weights(folder)` writes
    trainer/ (and generator/ when needed) into the folder being assembled."""
    final = Path(path).expanduser().resolve()
    staging = final.with_name(f".{final.name}.partial")
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir(parents=True)
    try:
        save_weights(staging)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)  # a failed save leaves no half checkpoint
        raise
    (staging / "checkpoint.json").write_text(json.dumps({"format": FORMAT, "time": time.time(), **state}, indent=1))
    (staging / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
    if data is not None:
        (staging / "data").mkdir()
        for split, rows in data.items():
            _write_lines(staging / "data" / f"{split}.jsonl", rows)
    (staging / "live.json").write_text(json.dumps(live))
    _write_lines(staging / "buffer.jsonl", [asdict(e) for e in episodes])
    (staging / "buffer_ids.json").write_text(json.dumps(sorted(sample_ids)))
    _write_lines(staging / "metrics.jsonl", metrics)
    old = final.with_name(f".{final.name}.old")
    if final.exists():
        final.rename(old)
    staging.rename(final)
    shutil.rmtree(old, ignore_errors=True)
    return final


def read(path: str | Path) -> Checkpoint:
    """The checkpoint at `path`; `FileNotFoundError` naming what is missing."""
    root = Path(path).expanduser().resolve()
    if not (root / "checkpoint.json").is_file():
        raise FileNotFoundError(f"{root} is not a forge_nb checkpoint (no checkpoint.json)")
    data = None
    if (root / "data").is_dir():
        data = {f.stem: _read_lines(f) for f in sorted((root / "data").glob("*.jsonl"))}
    return Checkpoint(
        root,
        json.loads((root / "checkpoint.json").read_text()),
        yaml.safe_load((root / "config.yaml").read_text()),
        data,
        json.loads((root / "live.json").read_text()),
        [Episode(**row) for row in _read_lines(root / "buffer.jsonl")],
        json.loads((root / "buffer_ids.json").read_text()),
        _read_lines(root / "metrics.jsonl"),
    )


def periodic(folder: str | Path) -> list[tuple[int, Path]]:
    """The periodic checkpoints in `folder`, as (step, path), oldest first."""
    root = Path(folder)
    found = []
    for p in root.glob("step-*") if root.is_dir() else ():
        if (p / "checkpoint.json").is_file() and p.name[5:].isdigit():
            found.append((int(p.name[5:]), p))
    return sorted(found)


def newest(found: list[tuple[int, Path]], at_or_before: int | None = None) -> Path | None:
    """The newest of `found` (step, path) that still exists, at or before step `at_or_before` if given."""
    ok = [(n, p) for n, p in found if p.is_dir() and (at_or_before is None or n <= at_or_before)]
    return max(ok, key=lambda f: f[0])[1] if ok else None


def prune(folder: str | Path, keep: int) -> None:
    """Delete all but the newest `keep` periodic checkpoints of `folder` (0: keep all)."""
    if keep > 0:
        for _, path in periodic(folder)[:-keep]:
            shutil.rmtree(path, ignore_errors=True)


def _write_lines(path: Path, rows: list[dict[str, Any]]) -> None:
    with open(path, "w") as f:
        for row in rows:
            f.write(json.dumps(row, default=_plain) + "\n")


def _read_lines(path: Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def _plain(value: Any) -> Any:
    """numpy scalars and the like (in metrics rows) as plain numbers."""
    if hasattr(value, "item"):
        return value.item()
    raise TypeError(f"cannot write {type(value).__name__} to a checkpoint")
