"""The rollout log: every sample of every step, kept on disk as Parquet, readable while the run goes on.

One file per trained batch (``step-00000012.parquet``) and per batch dropped as too stale
(``dropped-00000007-000003.parquet``), each complete when it appears (written under a temporary
name, then renamed), so pandas can read the folder at any time. Rows: the sample and its provenance
(ids, versions, staleness, whether it was trained), its rewards (``reward/<name>`` per member), its
advantage, its tokens with the generator's logprobs and, when it was trained, the trainer's (same
policy version, computed in the trainer's forward: the gap is the numerical and off-policy mismatch).
Writing happens on a thread of its own; the oldest files go when the folder passes `max_mb`.
"""

from __future__ import annotations

import json
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from forge_nb.rl.episode import Episode

_INT, _FLOAT, _TEXT, _BOOL = pa.int64(), pa.float64(), pa.string(), pa.bool_()
#: Every file has this schema (plus a float64 column ``reward/<name>`` per reward member), whatever its
#: values: a column that is None in one batch (trainer_logprobs of a dropped batch) has the same type as
#: in the others, so pyarrow and pandas read the folder as one table.
SCHEMA = {
    "step": _INT,
    "trained": _BOOL,
    "sample_id": _INT,
    "group_id": _INT,
    "prompt_id": _TEXT,
    "prompt": _TEXT,
    "completion": _TEXT,
    "target": _TEXT,
    "reward": _FLOAT,
    "advantage": _FLOAT,
    "policy_version": _INT,
    "reward_version": _INT,
    "loss_version": _INT,
    "staleness": _INT,
    "finish_reason": _TEXT,
    "num_tokens": _INT,
    "reward_error": _TEXT,
    "completion_ids": pa.list_(_INT),
    "logprobs": pa.list_(_FLOAT),
    "trainer_logprobs": pa.list_(_FLOAT),
    "extras": _TEXT,
    "completion_mask": pa.list_(_INT),  # multi-turn: 1 on the policy's tokens (None: every token)
    "turns": _TEXT,  # multi-turn: JSON list, one object per model call (text, tokens, reward, tool calls)
}
COLUMNS = list(SCHEMA)


@dataclass(frozen=True)
class Batch:
    """One batch to log: its episodes, the step it was trained as (or the trainer's step when dropped),
    its staleness, which of its samples were trained, and the trainer's logprobs of those."""

    episodes: list[Episode]
    step: int
    staleness: int
    trained_ids: frozenset[int]
    trainer_logprobs: dict[int, list[float]]
    dropped: bool = False


class RolloutLog:
    """Appends batches to Parquet files in `folder` on a writer thread; `read` filters them."""

    def __init__(self, folder: Path, max_mb: float = 512.0) -> None:
        self.folder, self.max_bytes = Path(folder), int(max_mb * (1 << 20))
        self.folder.mkdir(parents=True, exist_ok=True)
        self.written = 0  # rows on disk
        self.error: str | None = None  # the writer's last failure (the run goes on without the log)
        self._queue: queue.Queue[Batch | None] = queue.Queue()
        self._dropped = 0
        self._thread = threading.Thread(target=self._write_all, name="forge_nb-rollout-log", daemon=True)
        self._thread.start()

    def append(self, batch: Batch) -> None:
        self._queue.put(batch)

    def flush(self) -> None:
        """Wait until every batch appended so far is on disk."""
        self._queue.join()

    def close(self) -> None:
        """Write what is queued and stop the writer; `read` still works after."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join(30)

    def read(self, step: int | None = None, prompt_id: str | None = None, trained: bool | None = None) -> pd.DataFrame:
        """The logged samples (all, or of one `step` / one `prompt_id`), one row each, oldest first."""
        self.flush()
        files = [self.folder / f"step-{step:08d}.parquet"] if step is not None else self.files()
        frames = [pd.read_parquet(f) for f in files if f.is_file()]
        if not frames:
            return pd.DataFrame(columns=COLUMNS)
        df = pd.concat(frames, ignore_index=True)
        if prompt_id is not None:
            df = df[df.prompt_id == prompt_id]
        if trained is not None:
            df = df[df.trained == trained]
        return df.sort_values(["step", "sample_id"], kind="stable").reset_index(drop=True)

    def files(self) -> list[Path]:
        """The log's files, oldest first."""
        return sorted(self.folder.glob("*.parquet"), key=lambda p: p.stat().st_mtime_ns)

    def _write_all(self) -> None:
        while (batch := self._queue.get()) is not None:
            try:
                self._write(batch)
            except Exception as e:  # a full disk must not stop training: say so in status()
                self.error = f"{type(e).__name__}: {e}"
            finally:
                self._queue.task_done()
        self._queue.task_done()

    def _write(self, batch: Batch) -> None:
        name = f"step-{batch.step:08d}"
        if batch.dropped:
            self._dropped += 1
            name = f"dropped-{batch.step:08d}-{self._dropped:06d}"
        rows = [_row(e, batch) for e in batch.episodes]
        members = sorted({k for r in rows for k in r if k.startswith("reward/")})
        schema = pa.schema([*SCHEMA.items(), *((m, _FLOAT) for m in members)])
        table = pa.Table.from_pylist(rows, schema=schema)
        partial = self.folder / f".{name}.partial"
        pq.write_table(table, partial)
        partial.rename(self.folder / f"{name}.parquet")
        self.written += len(rows)
        self._prune()

    def _prune(self) -> None:
        files = self.files()
        total = sum(f.stat().st_size for f in files)
        while files and total > self.max_bytes and len(files) > 1:
            oldest = files.pop(0)
            total -= oldest.stat().st_size
            oldest.unlink(missing_ok=True)


def _row(e: Episode, batch: Batch) -> dict:
    row = {
        "step": batch.step,
        "trained": e.sample_id in batch.trained_ids,
        "sample_id": e.sample_id,
        "group_id": e.group_id,
        "prompt_id": e.prompt_id,
        "prompt": e.prompt,
        "completion": e.completion,
        "target": e.target,
        "reward": e.reward,
        "advantage": e.advantage,
        "policy_version": e.policy_version,
        "reward_version": e.reward_version,
        "loss_version": e.loss_version,
        "staleness": batch.staleness,
        "finish_reason": e.finish_reason,
        "num_tokens": e.num_tokens,
        "reward_error": e.reward_error,
        "completion_ids": e.completion_ids,
        "logprobs": e.logprobs,
        "trainer_logprobs": batch.trainer_logprobs.get(e.sample_id),
        "extras": json.dumps(e.extras, default=str) if e.extras else None,
        "completion_mask": e.completion_mask,
        "turns": json.dumps(e.turns) if e.turns is not None else None,
    }
    row.update({f"reward/{name}": value for name, value in e.rewards.items()})
    return row
