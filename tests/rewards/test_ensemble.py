"""The label-free ensemble: votes, a fit over a window, P(correct) per sample, and it travels as source."""

import random

import numpy as np
import pytest

from forge_nb.live.capture import compile_function
from forge_nb.live.closure import capture_callable
from forge_nb.rewards import Ensemble, addition_verifiers, judge
from forge_nb.rewards.ensemble import binarize, thresholds
from forge_nb.tasks.arithmetic import exact_match


def _addition_batch(prompts=64, group=8, seed=0):
    """A batch like a rollout of the bundled task: right sums, near misses, reversed digits, junk."""
    rng = random.Random(seed)
    columns = {"prompts": [], "completions": [], "prompt_id": [], "targets": []}
    for _ in range(prompts):
        a, b = rng.randint(0, 99), rng.randint(0, 99)
        for _ in range(group):
            r = rng.random()
            answer = str(a + b) if r < 0.4 else str(a + b + rng.choice([1, -1, 10, 2, 9])) if r < 0.85 else "1+"
            columns["prompts"].append(f"{a}+{b}=")
            columns["completions"].append(answer)
            columns["prompt_id"].append(f"{a}+{b}")
            columns["targets"].append(str(a + b))
    labels = np.array([exact_match(c, t) for c, t in zip(columns["completions"], columns["targets"])])
    return columns, labels


def test_the_ensemble_beats_its_best_verifier_and_the_majority_without_labels():
    columns, labels = _addition_batch()
    ensemble = Ensemble(addition_verifiers())
    p = np.array(ensemble(**columns))
    votes = ensemble.votes(**columns)
    single = max(((np.nan_to_num(votes[:, k]) > 0.5) == labels).mean() for k in range(votes.shape[1]))
    majority = ((np.nanmean(votes, 1) > 0.5) == labels).mean()
    accuracy = ((p > 0.5) == labels).mean()
    assert accuracy > 0.95 and accuracy > single and accuracy > majority
    report = ensemble.report()
    assert list(report.verifier) == ensemble.names and report.attrs["samples"] == len(labels)


def test_the_verifiers_never_see_the_targets():
    seen = []

    def spy(prompts, completions, **columns):
        seen.append(set(columns))
        return [1.0] * len(completions)

    Ensemble([spy, *addition_verifiers()])(["1+1="], ["2"], targets=["2"], prompt_id=["a"], step=[0])
    assert seen == [{"prompt_id", "step"}]


def test_the_fit_runs_over_a_window_of_recent_batches():
    ensemble = Ensemble(addition_verifiers(), window=300)
    for seed in range(3):
        columns, _ = _addition_batch(prompts=16, seed=seed)
        ensemble(**columns)
    assert len(ensemble._history) == 300


def test_graded_votes_are_cut_at_their_mean():
    votes = np.array([[0.2, 1.0], [0.4, 0.0], [0.9, np.nan]])
    cuts = thresholds(votes)
    assert cuts[1] == 0.5 and cuts[0] == pytest.approx(0.5)
    assert np.array_equal(binarize(votes, cuts), np.array([[0.0, 1.0], [0.0, 0.0], [1.0, np.nan]]), equal_nan=True)


def test_it_travels_as_source_without_what_it_learned(tmp_path):
    def short(prompt, completion):
        return len(completion) < 4

    ensemble = Ensemble([*addition_verifiers(), short, judge(parser="score")])
    ensemble.verifiers.pop()  # the judge would need a judge actor; its capture is what matters here
    ensemble.names.pop()
    columns, _ = _addition_batch(prompts=4)
    ensemble(**columns)
    code = capture_callable("reward", ensemble)
    assert "_history" not in code.source and "def short" in code.source
    assert "from forge_nb.rewards.verifiers import casting_out_nines" in code.source
    rebuilt = compile_function(code)
    assert rebuilt.names == ensemble.names and len(rebuilt(**columns)) == len(columns["prompts"])


def test_a_judge_inside_travels_with_its_parser():
    def parse(text):
        return 1.0 if "right" in text else 0.0

    code = capture_callable("reward", Ensemble([*addition_verifiers(), judge(parser=parse, batch_size=8)]))
    rebuilt = compile_function(code)
    assert rebuilt.verifiers[-1].batch_size == 8 and rebuilt.verifiers[-1].parser("all right") == 1.0


def test_names_must_be_distinct():
    with pytest.raises(ValueError, match="distinct name"):
        Ensemble(addition_verifiers(), names=["a"] * 6)


def test_a_verifier_that_duplicates_another_is_left_out_of_the_fit():
    def digits_again(prompt, completion):  # votes exactly as digits_only does
        return completion.strip().isdigit() and not completion.strip().startswith("0")

    columns, labels = _addition_batch(seed=3)
    ensemble = Ensemble([*addition_verifiers(), digits_again])
    accuracy = ((np.array(ensemble(**columns)) > 0.5) == labels).mean()
    report = ensemble.report().set_index("verifier")
    assert report.loc["digits_again", "duplicates"] == "digits_only" and accuracy > 0.95
