"""TRL's dataset formats load as they are: prompt strings or messages, `solution` or `answer`, prompt-only rows."""

import warnings

import pytest

from forge_nb.config import TaskConfig
from forge_nb.rewards.trl_form import PROMPT_AS_GIVEN
from forge_nb.tasks.data import DataError
from forge_nb.tasks.dataset import DatasetTask

DEFAULT = TaskConfig(name="dataset", eval_fraction=0.0)
#: Rows shaped like trl-lib/DeepMath-103K (conversational prompt-only, a `solution`), as TRL's GRPO docs use.
DEEPMATH = [
    {"prompt": [{"role": "user", "content": f"What is {i} + {i}?"}], "solution": str(2 * i), "difficulty": 1.5}
    for i in range(6)
]


def _load(rows, config=DEFAULT) -> DatasetTask:
    return DatasetTask.load(rows, config, 0)


def test_a_solution_column_is_the_answer_without_any_config():
    task = _load(DEEPMATH)
    problem = next(p for p in task.train if p.prompt[0]["content"] == "What is 2 + 2?")
    assert problem.target == "4"
    assert problem.extras == {"solution": "4", "difficulty": 1.5, PROMPT_AS_GIVEN: DEEPMATH[2]["prompt"]}


def test_answer_wins_over_solution_and_both_reach_the_reward():
    rows = [{"prompt": "q", "answer": "1", "solution": "one"}]
    (problem,) = _load(rows).train
    assert problem.target == "1" and problem.extras == {"answer": "1", "solution": "one"}


def test_a_hugging_face_dataset_of_trl_rows_loads_as_it_is():
    import datasets

    task = _load(datasets.Dataset.from_list(DEEPMATH))
    assert sorted(p.target for p in task.train) == ["0", "10", "2", "4", "6", "8"]


def test_prompt_only_rows_load_with_an_empty_target_and_a_warning():
    rows = [{"prompt": f"Write a haiku about {w}."} for w in ("rain", "snow", "sun")]
    with pytest.warns(UserWarning, match=r"no answer column \('answer' or 'solution'; columns: prompt\)"):
        task = _load(rows)
    assert [p.target for p in task.train] == ["", "", ""] and task.train[0].extras == {}


def test_a_completion_column_is_dropped_as_trl_does_for_grpo():
    rows = [{"prompt": "TL;DR of: a long post", "completion": " a summary"}]  # trl-lib/tldr's columns
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        (problem,) = _load(rows).train
    assert problem.extras == {}


def test_string_prompts_given_the_chat_template_keep_the_string_for_batched_rewards():
    rows = [{"prompt": "Hi", "answer": "Hello"}]
    (raw,) = _load(rows).train
    (chat,) = _load(rows, TaskConfig(name="dataset", eval_fraction=0.0, prompt_format="chat")).train
    assert PROMPT_AS_GIVEN not in raw.extras and chat.extras[PROMPT_AS_GIVEN] == "Hi"


def test_a_named_answer_column_that_is_missing_is_still_an_error():
    with pytest.raises(DataError, match=r"no answer column 'gold' in the train data \(columns: prompt, answer\)"):
        _load([{"prompt": "q", "answer": "1"}], TaskConfig(name="dataset", answer_column="gold"))
