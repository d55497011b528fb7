"""Your own data as a task: prompts (strings or chat messages), answers, and any other columns.

`DatasetTask.load(source, config, seed)` reads the rows (`tasks.data`), checks every row (a clear
error names the column or row, and nothing starts), gives each prompt a stable id, holds out an eval
split (the one given, or `task.eval_fraction` of the rows, seeded), and serves the training rows in
a seeded order that is reshuffled each epoch; `epoch` counts the passes.
"""

from __future__ import annotations

import hashlib
import json
import random
from dataclasses import dataclass, field
from typing import Any

from forge_nb.config import TaskConfig
from forge_nb.rewards.answers import answer_match
from forge_nb.rewards.trl_form import PROMPT_AS_GIVEN
from forge_nb.tasks.base import Problem
from forge_nb.tasks.data import DataError, load_splits
from forge_nb.tasks.trl_rows import DROPPED, answer_column_of

#: Column names of `DatasetTask.rows` (what a checkpoint stores), unlike any column of the user's data.
ROW_PROMPT, ROW_ANSWER, ROW_ID = "_forge_prompt", "_forge_answer", "_forge_prompt_id"
PRIVATE = (ROW_PROMPT, ROW_ANSWER, ROW_ID)

#: Keywords a reward already receives; a column with one of these names would shadow it.
RESERVED = ("prompt", "completion", "target", "step", "policy_version", "sample_id", "prompt_id")


@dataclass
class DatasetTask:
    """Training problems in a seeded order per epoch, and a fixed held-out set."""

    train: list[Problem]
    held_out: list[Problem]
    seed: int = 0
    name: str = "dataset"
    epoch: int = 0  # completed passes over the training rows
    position: int = 0  # next row of this epoch's order
    _order: list[int] = field(default_factory=list, repr=False)

    @classmethod
    def load(cls, source: Any, config: TaskConfig, seed: int = 0) -> DatasetTask:
        """Rows from `source` (or `config.path` when `source` is None) -> a task; `DataError` if unusable."""
        if source is None:
            if not config.path:
                raise DataError("task.name='dataset' needs data: forge_nb.up(task=rows) or task.path=FILE")
            source = config.path
        splits = load_splits(source)
        train = to_problems(splits["train"], config, "train")
        if "eval" in splits:
            held_out = to_problems(splits["eval"], config, "eval")[: config.eval_size]
        else:
            train, held_out = hold_out(train, config.eval_fraction, config.eval_size, seed)
        if not train:
            raise DataError(f"task: no training rows left after holding out {len(held_out)} for evaluation")
        return cls(train, held_out, seed)

    def sample(self, n: int) -> list[Problem]:
        out = []
        while len(out) < n:
            if self.position == 0 or not self._order:
                self._order = list(range(len(self.train)))
                random.Random(f"dataset-{self.seed}-epoch-{self.epoch}").shuffle(self._order)
            out.append(self.train[self._order[self.position]])
            self.position += 1
            if self.position == len(self._order):
                self.epoch, self.position = self.epoch + 1, 0
        return out

    def eval_set(self) -> list[Problem]:
        return list(self.held_out)

    def known_problems(self) -> list[Problem]:
        return self.train + self.held_out

    def state(self) -> dict:
        """The epoch, the position in it and its order (JSON-able)."""
        return {"epoch": self.epoch, "position": self.position, "order": list(self._order)}

    def load_state(self, state: dict) -> None:
        self.epoch, self.position, self._order = state["epoch"], state["position"], list(state["order"])

    def rows(self, split: str) -> list[dict]:
        """The problems of `split` ("train" or "eval") back as rows, under the `ROW_*` column names."""
        problems = self.train if split == "train" else self.held_out
        return [{**p.extras, ROW_PROMPT: p.prompt, ROW_ANSWER: p.target, ROW_ID: p.prompt_id} for p in problems]

    def verify(self, completion: str, target: str) -> float:
        """The final answer (boxed, else the last number, else the text) against the target."""
        return answer_match(completion, target)


def to_problems(rows: list[dict], config: TaskConfig, split: str) -> list[Problem]:
    """Check every row and make it a `Problem` (prompt, answer, stable id, the other columns as extras).

    As in TRL, every column but the prompt reaches the reward under its own name (the answer column
    also as `target`), a "completion" column (prompt-completion data) is dropped, and rows may be
    prompt-only: without the answer column (`trl_rows.answer_column_of`) the target is ""."""
    if not rows:
        raise DataError(f"task: the {split} data has no rows")
    columns = [c for c in rows[0] if c not in DROPPED]
    if config.prompt_column not in columns:
        raise DataError(
            f"task: no prompt column {config.prompt_column!r} in the {split} data (columns: {', '.join(columns)}); "
            "name yours with task.prompt_column='...'"
        )
    answer_column = answer_column_of(columns, config.answer_column, split)
    if config.id_column and config.id_column not in columns:
        raise DataError(f"task.id_column: no column {config.id_column!r} (columns: {', '.join(columns)})")
    used = {config.prompt_column, answer_column, config.id_column}
    clash = [c for c in columns if c not in used and c in RESERVED]
    if clash:
        raise DataError(f"task: column {clash[0]!r} would shadow the reward argument of that name; rename it")
    hidden = {config.prompt_column, config.id_column, *DROPPED, *(c for c in used if c in RESERVED or c in PRIVATE)}
    problems, seen = [], set()
    for i, row in enumerate(rows):
        prompt, answer = _prompt(row, i, config.prompt_column, split), row.get(answer_column, "")
        if not isinstance(answer, str):
            raise DataError(
                f"task: {split} row {i} has answer {answer!r} ({type(answer).__name__}) in column "
                f"{answer_column!r}; answers must be strings (e.g. df[col] = df[col].astype(str))"
            )
        prompt_id = str(row[config.id_column]) if config.id_column else _content_id(prompt, seen)
        if prompt_id in seen and config.id_column:
            raise DataError(f"task.id_column: id {prompt_id!r} appears twice ({split} row {i})")
        seen.add(prompt_id)
        extras = {k: v for k, v in row.items() if k not in hidden}
        if not isinstance(prompt, str) or config.prompt_format == "chat":  # the model sees it rendered
            extras[PROMPT_AS_GIVEN] = prompt
        problems.append(Problem(prompt_id, prompt, answer, extras))
    return problems


def hold_out(problems: list[Problem], fraction: float, most: int, seed: int) -> tuple[list[Problem], list[Problem]]:
    """A seeded `fraction` of the problems (at most `most`, at least one when fraction > 0) as the
    held-out set -> (train, held out). A prompt is never on both sides."""
    order = list(range(len(problems)))
    random.Random(f"dataset-{seed}-holdout").shuffle(order)
    count = min(most, max(1, round(fraction * len(problems)))) if fraction > 0 else 0
    held = set(order[:count])
    return [p for i, p in enumerate(problems) if i not in held], [problems[i] for i in sorted(held)]


def _prompt(row: dict, index: int, column: str, split: str):
    prompt = row[column]
    if isinstance(prompt, str) and prompt.strip():
        return prompt
    if isinstance(prompt, list | tuple) and prompt and all(_is_message(m) for m in prompt):
        return [{"role": m["role"], "content": m["content"]} for m in prompt]
    raise DataError(
        f"task: {split} row {index} has prompt {str(prompt)[:60]!r} in column {column!r}; expected a non-empty "
        'string or chat messages [{"role": "user", "content": "..."}]'
    )


def _is_message(m: Any) -> bool:
    return isinstance(m, dict) and isinstance(m.get("role"), str) and isinstance(m.get("content"), str)


def _content_id(prompt: str | list, seen: set[str]) -> str:
    """A hash of the prompt: the same row gets the same id in any order or run; a repeated prompt
    gets a suffix (#2, #3, ...)."""
    base = hashlib.sha1(json.dumps(prompt, sort_keys=True).encode()).hexdigest()[:12]
    prompt_id, k = base, 1
    while prompt_id in seen:
        k += 1
        prompt_id = f"{base}#{k}"
    return prompt_id
