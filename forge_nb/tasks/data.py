"""Reading your data: rows and splits from a list of dicts, a pandas DataFrame, a Hugging Face
`datasets.Dataset` / `DatasetDict`, a JSONL / JSON / CSV / Parquet file, or a dict of splits.

Everything becomes ``{split: [row, ...]}`` with plain Python values; which columns mean what is
decided later (`tasks.dataset`). `datasets` is never imported here: its objects are recognised by
what they offer (``to_list``, a mapping of splits).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from forge_nb.config import ConfigError

SUFFIXES = (".jsonl", ".json", ".csv", ".parquet")
#: Split names taken as the held-out split of a DatasetDict or a dict of splits, in this order.
EVAL_SPLITS = ("eval", "test", "validation", "valid", "dev")


class DataError(ConfigError):
    """Data that cannot be a task; the message names the column, row or file and the fix."""


def is_data(value: Any) -> bool:
    """Whether `value` is data to train on (as opposed to a config value such as a task name)."""
    if isinstance(value, str):
        return Path(value).suffix.lower() in SUFFIXES
    return isinstance(value, Path | list | tuple) or _is_frame(value) or _is_hf_dataset(value) or _is_splits(value)


def load_splits(source: Any) -> dict[str, list[dict]]:
    """`source` -> {"train": rows, "eval": rows (when given)}; rows are dicts of plain Python values."""
    if _is_splits(source) or _is_hf_dataset_dict(source):
        return _named_splits({str(k): load_rows(v) for k, v in source.items()})
    return {"train": load_rows(source)}


def load_rows(source: Any) -> list[dict]:
    """One split's rows."""
    if isinstance(source, str | Path):
        return _read_file(Path(source).expanduser())
    if _is_frame(source):
        return [_plain_row(r) for r in source.to_dict("records")]
    if _is_hf_dataset(source):
        return [_plain_row(r) for r in source.to_list()]
    if isinstance(source, list | tuple):
        bad = next((i for i, r in enumerate(source) if not isinstance(r, Mapping)), None)
        if bad is not None:
            raise DataError(f"task: row {bad} is a {type(source[bad]).__name__}, not a dict of columns")
        return [_plain_row(dict(r)) for r in source]
    raise DataError(
        f"task: cannot read {type(source).__name__} as data; give a list of dicts, a pandas DataFrame, a Hugging "
        f"Face Dataset / DatasetDict, or a path to a {' / '.join(SUFFIXES)} file"
    )


def _read_file(path: Path) -> list[dict]:
    import pandas as pd

    if not path.is_file():
        raise DataError(f"task.path: file {str(path)!r} does not exist")
    suffix = path.suffix.lower()
    if suffix not in SUFFIXES:
        raise DataError(f"task.path: {path.name!r} is not a {' / '.join(SUFFIXES)} file")
    try:
        if suffix == ".csv":
            frame = pd.read_csv(path, dtype=str, keep_default_na=False)  # answers stay the text written
        elif suffix == ".parquet":
            frame = pd.read_parquet(path)
        else:
            frame = pd.read_json(path, lines=suffix == ".jsonl", dtype=False)
    except ValueError as e:
        raise DataError(f"task.path: cannot read {path.name!r}: {e}") from None
    return [_plain_row(r) for r in frame.to_dict("records")]


def _named_splits(splits: dict[str, list[dict]]) -> dict[str, list[dict]]:
    """{"train": ..., "test": ...} -> {"train": ..., "eval": ...}."""
    if "train" not in splits:
        raise DataError(f"task: the splits given are {sorted(splits)}; one must be called 'train'")
    out = {"train": splits["train"]}
    held = next((name for name in EVAL_SPLITS if name in splits), None)
    if held is not None:
        out["eval"] = splits[held]
    return out


def _plain_row(row: dict) -> dict:
    return {str(k): _plain(v) for k, v in row.items()}


def _plain(value: Any) -> Any:
    """numpy / pandas scalars and arrays -> Python values (they pickle small and compare simply)."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        return _plain(value.tolist())
    if isinstance(value, list):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {k: _plain(v) for k, v in value.items()}
    return value


def _is_frame(value: Any) -> bool:
    return hasattr(value, "to_dict") and hasattr(value, "columns") and hasattr(value, "iloc")


def _is_hf_dataset(value: Any) -> bool:
    return hasattr(value, "to_list") and hasattr(value, "column_names") and not isinstance(value, Mapping)


def _is_hf_dataset_dict(value: Any) -> bool:
    return isinstance(value, Mapping) and value and all(_is_hf_dataset(v) for v in value.values())


def _is_splits(value: Any) -> bool:
    return isinstance(value, Mapping) and "train" in value and not {"prompt", "answer"} & set(value)


def take_task_data(overrides: dict[str, Any]) -> tuple[dict[str, Any], Any]:
    """Split `forge_nb.up(..., task=...)` into config overrides and in-memory data: rows, a DataFrame
    or a Dataset become `data` (task.name "dataset"); a file path becomes task.path; a bundled
    task's name or a dict of task fields stays config."""
    task = overrides.get("task")
    if not is_data(task):
        return overrides, None
    rest = {k: v for k, v in overrides.items() if k != "task"} | {"task.name": "dataset"}
    if isinstance(task, str | Path):
        return rest | {"task.path": str(task)}, None
    return rest, task
