"""The batched reward form (TRL's): one call per batch with its columns, checked like a per-sample one."""

import math
import time

import numpy as np
import pytest

from forge_nb.checks import CheckFailed, CheckTimedOut
from forge_nb.live.validate import validate_reward
from forge_nb.rewards.batch import RewardBatch, RewardSample, Scores
from forge_nb.rewards.forms import is_batched
from forge_nb.rewards.scoring import score_members

PROBES = [
    RewardSample("1+1=", "2", "2", {"step": 3, "prompt_id": "a", "level": "easy"}),
    RewardSample("2+2=", "5", "4", {"step": 3, "prompt_id": "b", "level": "hard"}),
]


def test_a_function_that_takes_completions_is_batched():
    assert is_batched(lambda prompts, completions, **kw: []) and is_batched(lambda completions: [])
    assert not is_batched(lambda prompt, completion, target: 0.0)

    class Scorer:
        def __call__(self, prompts, completions):
            return [0.0] * len(completions)

    assert is_batched(Scorer())


def test_a_batched_reward_gets_the_columns_it_names():
    seen = {}

    def reward(completions, targets, level):
        seen.update(completions=completions, targets=targets, level=level)
        return [float(c == t) for c, t in zip(completions, targets)]

    assert validate_reward(reward, PROBES, 1.0) == [1.0, 0.0]
    assert seen == {"completions": ["2", "5"], "targets": ["2", "4"], "level": ["easy", "hard"]}


def test_with_kwargs_it_gets_every_column():
    def reward(prompts, completions, **columns):
        trl = {"completion_ids", "trainer_state", "log_extra", "log_metric"}  # what TRL's GRPOTrainer passes too
        assert set(columns) == {"targets", "step", "prompt_id", "level", *trl} and columns["step"] == [3, 3]
        return np.array([0.5, 0.25])  # arrays and tensors count as lists

    assert validate_reward(reward, PROBES, 1.0) == [0.5, 0.25]


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda completions: [1.0], r"returned 1 values \[1.0\]; expected a list of 2 floats, one per sample"),
        (lambda completions: 1.0, r"returned float 1.0; expected a list of 2 floats"),
        (lambda completions: [1.0, math.nan], r"returned nan; expected a finite float for probe sample 1"),
        (lambda completions: [1.0, "x"], r"returned str 'x'; expected a float for probe sample 1"),
        (lambda completions: 1 / 0, r"raised ZeroDivisionError: division by zero.*probe batch of 2 samples"),
        (lambda completions: time.sleep(2), r"did not return within the 0.2 s timeout"),
    ],
)
def test_a_bad_batched_reward_is_refused_with_the_cause(fn, message):
    with pytest.raises(CheckFailed, match=message):
        validate_reward(fn, PROBES, 0.2)


def test_a_timeout_is_its_own_kind_of_failure():
    with pytest.raises(CheckTimedOut):
        validate_reward(lambda completions: time.sleep(1), PROBES, 0.1)


def test_both_forms_score_one_batch_side_by_side():
    batch = RewardBatch(["1+1=", "2+2=", "3+3="], ["2", "5", "6"], ["2", "4", "6"], [0] * 3, [0, 1, 2], ["a", "b", "c"],
                        [{"level": "easy"}, {}, {"level": "hard"}], step=7)  # fmt: skip
    assert batch.columns()["level"] == ["easy", None, "hard"] and batch.columns()["step"] == [7, 7, 7]
    fns = {
        "each": lambda prompt, completion, target: float(completion == target),
        "batch": lambda completions, targets: [float(c == t) * 2 for c, t in zip(completions, targets)],
        "bad": lambda completions: [1.0, math.inf, 1.0],
    }
    components = {name: [None] * 3 for name in fns}
    errors = {}
    assert score_members(fns, batch, components, errors) == {}
    assert components["each"] == [1.0, 0.0, 1.0] and components["batch"] == [2.0, 0.0, 2.0]
    assert errors == {1: "bad: returned inf; expected a finite float"}
    scores = Scores.combine(components, {"each": 1.0, "batch": 0.5, "bad": 0.0}, errors, 4)
    assert scores.rewards == [2.0, None, 2.0]
