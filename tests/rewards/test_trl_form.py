"""A batched reward is called as TRL's GRPOTrainer calls one: messages for a conversational dataset,
completion_ids, every column by name, trainer_state, and None meaning "no score for this sample"."""

import math

from forge_nb.live.capture import compile_function, from_source
from forge_nb.live.validate import validate_reward
from forge_nb.rewards import Ensemble, agreement, judge
from forge_nb.rewards.batch import RewardBatch, RewardSample, Scores
from forge_nb.rewards.forms import is_batched
from forge_nb.rewards.judge import render
from forge_nb.rewards.scoring import score_members
from forge_nb.rewards.trl_form import PROMPT_AS_GIVEN, TrainerState

CHAT = [{"role": "user", "content": "What is 2 + 2?"}]
TEXT = "<|im_start|>user\nWhat is 2 + 2?<|im_end|>\n<|im_start|>assistant\n"


def _batch(extras=None) -> RewardBatch:
    extras = extras or {"solution": "4", PROMPT_AS_GIVEN: CHAT}
    return RewardBatch(
        [TEXT, TEXT], ["It is 4", "5"], ["4", "4"], [2, 2], [10, 11], ["p", "p"], [extras, extras], step=7,
        completion_ids=[[40, 41, 42], [43]],
    )  # fmt: skip


def test_a_conversational_batch_is_given_as_trl_gives_it():
    seen = {}

    def reward(prompts, completions, completion_ids, solution, trainer_state, **kwargs):
        seen.update(prompts=prompts, completions=completions, ids=completion_ids, solution=solution)
        seen.update(step=trainer_state.global_step, kwargs=set(kwargs))
        return [1.0, 0.0]

    components, errors = {"r": [None, None]}, {}
    score_members({"r": reward}, _batch(), components, errors)
    assert errors == {} and components["r"] == [1.0, 0.0]
    assert seen["prompts"] == [CHAT, CHAT] and seen["solution"] == ["4", "4"]
    assert seen["completions"] == [
        [{"role": "assistant", "content": "It is 4"}],
        [{"role": "assistant", "content": "5"}],
    ]
    assert seen["ids"] == [[40, 41, 42], [43]] and seen["step"] == 7
    assert PROMPT_AS_GIVEN not in seen["kwargs"] and {"log_extra", "log_metric", "targets"} <= seen["kwargs"]


def test_a_plain_text_batch_gives_strings_and_per_sample_rewards_are_unchanged():
    batch = _batch({"solution": "4"})
    columns = batch.columns()
    assert columns["prompts"] == [TEXT, TEXT] and columns["completions"] == ["It is 4", "5"]
    (sample, _) = list(_batch().samples())  # a per-sample reward still sees the text and no hidden column
    assert sample.prompt == TEXT and sample.completion == "It is 4" and PROMPT_AS_GIVEN not in sample.context
    assert sample.completion_ids == [40, 41, 42] and sample.prompt_given == CHAT


def test_the_probe_batch_is_given_the_same_way():
    samples = list(_batch().samples())

    def reward(prompts, completions, completion_ids, trainer_state, **kwargs):
        assert prompts == [CHAT, CHAT] and completions[0] == [{"role": "assistant", "content": "It is 4"}]
        assert completion_ids == [[40, 41, 42], [43]] and trainer_state == TrainerState(global_step=7)
        return [len(ids) for ids in completion_ids]

    assert validate_reward(reward, samples, 1.0) == [3.0, 1.0]


def test_none_means_no_score_for_that_sample_and_adds_nothing_to_the_sum():
    fns = {"applies": lambda completions: [None, 1.0], "format": lambda completions: [0.5, 0.5]}
    components, errors = {n: [None, None] for n in fns}, {}
    score_members(fns, _batch(), components, errors)
    assert errors == {} and components["applies"] == [None, 1.0]
    scores = Scores.combine(components, {"applies": 1.0, "format": 2.0}, errors, 1)
    assert scores.rewards == [1.0, 2.0]
    probe = [RewardSample("q", "c", "t", {"step": 0})] * 2
    assert validate_reward(lambda completions: [None, 0.0], probe, 1.0) == [None, 0.0]


def test_a_nan_is_still_refused():
    components, errors = {"r": [None, None]}, {}
    score_members({"r": lambda completions: [math.nan, 1.0]}, _batch(), components, errors)
    assert errors == {0: "returned nan; expected a finite float"}


def test_forge_nb_batched_rewards_read_the_text_of_messages():
    columns = _batch().columns()
    assert render("Q: {question} A: {completion}", columns) == [
        "Q: What is 2 + 2? A: It is 4",
        "Q: What is 2 + 2? A: 5",
    ]
    assert agreement(columns["prompts"], columns["completions"]) == [0.0, 0.0]  # two different answers
    ensemble = Ensemble([agreement, lambda prompt, completion: float("4" in completion)])
    votes = ensemble.votes(**{k: v for k, v in columns.items()})
    assert votes[:, 1].tolist() == [1.0, 0.0]
    assert judge().template  # built without a model running: the judge renders the same way


def test_a_reward_of_completion_ids_only_is_batched_as_trl_calls_it():
    def repetition(completion_ids, **kwargs):
        return [-float(len(ids) != len(set(ids))) for ids in completion_ids]

    assert is_batched(repetition)
    components, errors = {"r": [None, None]}, {}
    score_members({"r": repetition}, _batch({"ids": 1}), components, errors)
    assert errors == {} and components["r"] == [0.0, 0.0]


def test_an_async_reward_as_trl_allows_is_run_to_completion_where_it_is_compiled():
    source = (
        "import asyncio\n\n\n"
        "async def judged(prompts, completions, **kwargs):\n"
        "    await asyncio.sleep(0)\n"
        "    return [float(c[0]['content'] == 'It is 4') for c in completions]\n"
    )
    fn = compile_function(from_source("reward", source))
    assert is_batched(fn)
    components, errors = {"r": [None, None]}, {}
    score_members({"r": fn}, _batch(), components, errors)
    assert errors == {} and components["r"] == [1.0, 0.0]
    assert validate_reward(fn, list(_batch().samples()), 1.0) == [1.0, 0.0]
