"""Your own data as a task: every source reads the same, bad rows are named, order and ids are stable."""

import json

import pandas as pd
import pytest

from forge_nb.config import TaskConfig
from forge_nb.tasks.data import DataError, load_splits, take_task_data
from forge_nb.tasks.dataset import DatasetTask

ROWS = [
    {"question": f"What is {a} + {b}?", "solution": str(a + b), "difficulty": a % 3}
    for a, b in [(1, 2), (3, 4), (5, 6), (7, 8), (9, 10), (11, 12), (13, 14), (15, 16), (17, 18), (19, 20)]
]
COLUMNS = TaskConfig(name="dataset", prompt_column="question", answer_column="solution", eval_fraction=0.2)


def _task(source, config=COLUMNS, seed=0) -> DatasetTask:
    return DatasetTask.load(source, config, seed)


def _signature(task: DatasetTask):
    return sorted((p.prompt_id, p.prompt, p.target, json.dumps(p.extras)) for p in task.train + task.held_out)


def test_every_source_gives_the_same_problems(tmp_path):
    frame = pd.DataFrame(ROWS)
    frame.to_json(tmp_path / "d.jsonl", orient="records", lines=True)
    frame.to_csv(tmp_path / "d.csv", index=False)
    frame.to_parquet(tmp_path / "d.parquet")
    expected = _signature(_task(ROWS))
    for source in (frame, tmp_path / "d.jsonl", str(tmp_path / "d.csv"), tmp_path / "d.parquet"):
        task = _task(source)
        # CSV holds text: the extra column comes back as a string there
        got = [(i, p, t, e.replace('"', "")) for i, p, t, e in _signature(task)]
        assert got == [(i, p, t, e.replace('"', "")) for i, p, t, e in expected], source


def test_hugging_face_dataset_and_dataset_dict_with_a_test_split():
    import datasets

    ds = datasets.Dataset.from_list(ROWS)
    assert _signature(_task(ds)) == _signature(_task(ROWS))
    splits = datasets.DatasetDict({"train": ds.select(range(8)), "test": ds.select(range(8, 10))})
    task = _task(splits)
    assert len(task.train) == 8 and [p.target for p in task.held_out] == ["35", "39"]


def test_columns_map_and_every_column_but_the_prompt_becomes_a_reward_keyword():
    task = _task(ROWS)
    problem = next(p for p in task.train if p.prompt == "What is 3 + 4?")
    assert problem.target == "7" and problem.extras == {"solution": "7", "difficulty": 0}  # as TRL passes them


def test_chat_messages_are_kept_as_messages():
    rows = [{"prompt": [{"role": "user", "content": "hi"}], "answer": "hello"}] * 3
    task = _task(rows, TaskConfig(name="dataset", eval_fraction=0.0))
    assert task.train[0].prompt == [{"role": "user", "content": "hi"}]
    assert len({p.prompt_id for p in task.train}) == 3  # the same prompt three times: three ids


def test_a_held_out_fraction_is_seeded_capped_and_disjoint():
    task = _task(ROWS)
    assert len(task.held_out) == 2 and len(task.train) == 8
    assert not {p.prompt_id for p in task.train} & {p.prompt_id for p in task.held_out}
    assert _task(ROWS).held_out == task.held_out  # same seed, same split
    capped = _task(
        ROWS,
        TaskConfig(name="dataset", prompt_column="question", answer_column="solution", eval_fraction=0.5, eval_size=3),
    )
    assert len(capped.held_out) == 3


def test_ids_are_stable_when_rows_are_reordered():
    forward, backward = _task(ROWS), _task(list(reversed(ROWS)))
    ids = {p.prompt: p.prompt_id for p in forward.train + forward.held_out}
    assert all(ids[p.prompt] == p.prompt_id for p in backward.train + backward.held_out)


def test_training_order_is_seeded_reshuffled_each_epoch_and_epochs_are_counted():
    task = _task(ROWS)
    first, second = task.sample(8), task.sample(8)
    assert task.epoch == 2 and task.position == 0
    assert sorted(p.prompt_id for p in first) == sorted(p.prompt_id for p in task.train)
    assert [p.prompt_id for p in first] != [p.prompt_id for p in second]  # reshuffled
    again = _task(ROWS)
    assert [p.prompt_id for p in again.sample(8)] == [p.prompt_id for p in first]


@pytest.mark.parametrize(
    ("rows", "config", "message"),
    [
        (
            ROWS,
            TaskConfig(name="dataset"),
            r"no prompt column 'prompt' in the train data \(columns: question, solution, "
            r"difficulty\); name yours with task.prompt_column='...'",
        ),
        ([], COLUMNS, "the train data has no rows"),
        (
            [{"question": "q", "solution": 4}],
            COLUMNS,
            r"train row 0 has answer 4 \(int\) in column 'solution'; answers "
            "must be strings",
        ),
        ([{"question": "", "solution": "4"}], COLUMNS, "train row 0 has prompt '' in column 'question'"),
        ([{"question": "q", "solution": "4", "step": 1}], COLUMNS, "column 'step' would shadow the reward argument"),
        (
            [{"question": "q", "solution": "4"}] * 2,
            TaskConfig(name="dataset", prompt_column="question", answer_column="solution", id_column="question"),
            "task.id_column: id 'q' appears twice",
        ),
    ],
)
def test_bad_data_is_one_clear_error_naming_the_column_or_row(rows, config, message):
    with pytest.raises(DataError, match=message):
        _task(rows, config)


def test_a_missing_file_and_an_unreadable_source_are_clear_errors(tmp_path):
    with pytest.raises(DataError, match="task.path: file .*nope.jsonl' does not exist"):
        load_splits(tmp_path / "nope.jsonl")
    with pytest.raises(DataError, match="cannot read int as data"):
        load_splits(7)


def test_up_takes_rows_a_frame_or_a_file_as_task():
    frame = pd.DataFrame(ROWS)
    overrides, data = take_task_data({"task": frame, "lr": 1e-4})
    assert data is frame and overrides == {"lr": 1e-4, "task.name": "dataset"}
    overrides, data = take_task_data({"task": "train.jsonl"})
    assert data is None and overrides == {"task.name": "dataset", "task.path": "train.jsonl"}
    assert take_task_data({"task": "addition"}) == ({"task": "addition"}, None)
