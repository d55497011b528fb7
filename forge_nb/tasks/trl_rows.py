"""TRL's dataset formats as forge_nb tasks: which column is the answer, and which columns are dropped.

TRL's GRPO data is "prompt-only": a `prompt` column (a string, or chat messages for a
conversational dataset) and any other columns, which its trainer passes to every reward by name.
Math sets name the reference `solution` (trl-lib/DeepMath-103K, NuminaMath) or `answer` (GSM8K);
some rows carry none (a format or length reward needs no label). A prompt-completion dataset's
`completion` column is not used by GRPO (TRL leaves it out of the reward's keywords), so it is
dropped here too.
"""

from __future__ import annotations

import warnings

from forge_nb.tasks.data import DataError

#: Answer columns tried, in order, when task.answer_column is left at its default ("answer").
ANSWER_COLUMNS = ("answer", "solution")
#: Columns TRL's GRPOTrainer never passes to a reward: dropped from the rows.
DROPPED = ("completion", "completion_ids")


def answer_column_of(columns: list[str], configured: str, split: str) -> str | None:
    """The column holding the reference answer (the reward's `target`): `configured` if the data
    has it; with the default "answer" absent, "solution"; with neither, None (prompt-only rows, whose
    target is "", with a warning). A column named in task.answer_column that is missing is a
    `DataError`."""
    if configured in columns:
        return configured
    if configured != ANSWER_COLUMNS[0]:
        raise DataError(
            f"task: no answer column {configured!r} in the {split} data (columns: {', '.join(columns)}); "
            "name yours with task.answer_column='...'"
        )
    found = next((c for c in ANSWER_COLUMNS if c in columns), None)
    if found is None and split == "train":
        warnings.warn(
            f"task: no answer column ({' or '.join(map(repr, ANSWER_COLUMNS))}; columns: {', '.join(columns)}): "
            "prompt-only rows, every target is ''. The built-in answer check then scores 0: set your own reward "
            "(s.set_reward(fn) replaces it), or name the answer with task.answer_column='...'",
            stacklevel=4,
        )
    return found
