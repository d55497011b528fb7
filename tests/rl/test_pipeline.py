"""The rollout pipeline's pure steps, without a mesh: episodes, scores, penalties, advantages, train subset."""

import math

import pytest
import torch

from forge_nb.rewards.batch import Scores
from forge_nb.rl.advantages import decoupled
from forge_nb.rl.completion import Completion
from forge_nb.rl.pipeline import (
    EmptyTrainBatch,
    add_overlong_penalty,
    apply_scores,
    assign_advantages,
    make_episodes,
    reward_components,
    train_subset,
)
from forge_nb.rl.rollout import Rollout
from forge_nb.tasks.base import Problem

PROBLEMS = [Problem("1+1", "1+1=", "2"), Problem("2+3", "2+3=", "5", {"difficulty": 2})]
TEXTS = ["<q>1+1=", "<q>2+3="]  # the prompts as the model saw them


def _completions(texts: list[list[str]], lengths: list[list[int]] | None = None) -> list[list[Completion]]:
    lengths = lengths or [[len(t) + 1 for t in group] for group in texts]
    return [
        [Completion([1, 4], list(range(n)), [-0.5] * n, t, "stop") for t, n in zip(group, ns)]
        for group, ns in zip(texts, lengths)
    ]


def _episodes(rewards: list[float], errors: dict[int, str] | None = None, group_size: int = 3):
    groups = [["x"] * group_size for _ in range(len(rewards) // group_size)]
    episodes = make_episodes(PROBLEMS[: len(groups)], TEXTS, _completions(groups), 4, 10)
    values = [None if i in (errors or {}) else r for i, r in enumerate(rewards)]
    apply_scores(episodes, Scores(values, errors or {}, components={"reward": values}))
    return episodes


def test_episodes_are_prompt_major_with_consecutive_ids_and_group_ids():
    episodes = make_episodes(PROBLEMS, TEXTS, _completions([["2", "3"], ["5", "6"]]), 7, first_sample_id=100)
    assert [e.sample_id for e in episodes] == [100, 101, 102, 103]
    assert [e.group_id for e in episodes] == [100, 100, 102, 102]
    assert [(e.prompt, e.completion, e.target) for e in episodes][2] == ("<q>2+3=", "5", "5")
    assert episodes[2].extras == {"difficulty": 2} and episodes[0].extras == {}
    assert {e.policy_version for e in episodes} == {7}
    assert episodes[0].logprobs == [-0.5, -0.5] and episodes[0].finish_reason == "stop"


def test_probe_episodes_use_no_ids():
    episodes = make_episodes(PROBLEMS, TEXTS, _completions([["2"], ["5"]]), 0, first_sample_id=None)
    assert {e.sample_id for e in episodes} == {e.group_id for e in episodes} == {-1}


def test_scores_fill_rewards_and_a_failed_sample_gets_nan_and_an_error_record():
    episodes = make_episodes(PROBLEMS[:1], TEXTS, _completions([["a", "b", "c"]]), 0, 0)
    components = {"exact": [1.0, None, 0.0], "fmt": [0.5, 1.0, 1.0]}
    scores = Scores.combine(components, {"exact": 1.0, "fmt": 0.2}, {1: "exact: raised KeyError: 'x'"}, 3)
    errors = apply_scores(episodes, scores)
    assert [e.reward_version for e in episodes] == [3, 3, 3]
    assert episodes[0].reward == pytest.approx(1.1) and episodes[2].reward == pytest.approx(0.2)
    assert episodes[0].rewards == {"exact": 1.0, "fmt": 0.5} and episodes[1].rewards == {"fmt": 1.0}
    assert math.isnan(episodes[1].reward) and episodes[1].reward_error == "exact: raised KeyError: 'x'"
    expected = {"sample_id": 1, "reward_version": 3, "prompt": "<q>1+1=", "completion": "b"}
    expected["error"] = "exact: raised KeyError: 'x'"
    assert errors == [expected]
    assert scores.weights == {"exact": 1.0, "fmt": 0.2}  # what the sums were weighted with, for GDPO


def test_gdpo_advantages_normalise_each_member_its_own_reward_and_the_penalty_on_their_own():
    """A failed sample counts in no member's statistics; a trajectory's own reward replaces the members' scores
    (kept beside it) as it replaces their sum; the overlong penalty is a reward of its own, of weight 1; a member
    of weight 0 is left out."""
    episodes = make_episodes(PROBLEMS, TEXTS, _completions([["a", "b", "c"], ["d", "e", "f"]], [[4, 6, 8]] * 2), 0, 0)
    components = {"exact": [1.0, 0.0, 1.0, 0.0, None, 1.0], "fmt": [1.0, 1.0, 0.0, 0.5, 1.0, 0.0]}
    components["off"] = [3.0] * 6
    weights = {"exact": 1.0, "fmt": 0.5, "off": 0.0}
    apply_scores(episodes, Scores.combine(components, weights, {4: "exact: failed"}, 1))
    episodes[5].rewards, episodes[5].reward = {**episodes[5].rewards, "rollout": 0.25}, 0.25
    add_overlong_penalty(episodes, max_tokens=8, cache=4)
    names, table = reward_components(episodes, weights)
    assert names == ["exact", "fmt", "rollout", "overlong"]
    assert table[4].isnan().all() and table[5, :2].isnan().all() and table[5, 2] == 0.25
    assert table[0].tolist()[:2] == [1.0, 1.0] and table[:, 3].nan_to_num().tolist() == [0, -0.5, -1, 0, 0, -1]
    assign_advantages(episodes, 3, weights=weights)
    expected = decoupled(table.view(2, 3, 4), torch.tensor([1.0, 0.5, 1.0, 1.0])).flatten()
    assert [e.advantage for e in episodes] == pytest.approx(expected.tolist())
    assert episodes[4].advantage == 0 and episodes[0].advantage != episodes[1].advantage


def test_overlong_penalty_ramps_over_the_cache_and_keeps_the_raw_parts():
    episodes = make_episodes(PROBLEMS[:1], TEXTS, _completions([["a", "b", "c", "d"]], [[4, 5, 7, 9]]), 0, 0)
    values = [1.0, 1.0, 1.0, None]
    apply_scores(episodes, Scores(values, {3: "failed"}, components={"reward": values}))
    add_overlong_penalty(episodes, max_tokens=8, cache=4)  # free up to 4 tokens, -1 at 8
    assert [e.rewards.get("overlong") for e in episodes] == [0.0, -0.25, -0.75, None]
    assert [e.reward for e in episodes[:3]] == [1.0, 0.75, 0.25]
    assert episodes[1].rewards["reward"] == 1.0


def test_an_unscorable_sample_gets_no_overlong_penalty_and_stays_unscored():
    episodes = make_episodes(PROBLEMS[:1], TEXTS, _completions([["a", "b"]], [[9, 9]]), 0, 0)
    values = [1.0, None]  # every member gave None for the second: TRL's "no score"
    apply_scores(episodes, Scores(values, {}, components={"reward": values}))
    add_overlong_penalty(episodes, max_tokens=8, cache=4)
    assert episodes[0].rewards["overlong"] == -1.0 and "overlong" not in episodes[1].rewards
    assert episodes[0].scored and not episodes[1].scored


def test_advantages_are_relative_within_each_group_and_failed_samples_do_not_count():
    episodes = _episodes([1.0, 0.0, 0.0, 5.0, 5.0, 1.0], errors={5: "failed"})
    assign_advantages(episodes, group_size=3, normalize_std=False)
    assert [e.advantage for e in episodes] == pytest.approx([2 / 3, -1 / 3, -1 / 3, 0.0, 0.0, 0.0])
    assign_advantages(episodes, group_size=3, normalize_std=True)  # sample std (n - 1) by default
    assert sum(e.advantage for e in episodes[:3]) == pytest.approx(0.0, abs=1e-6)
    assert episodes[0].advantage == pytest.approx((2 / 3) / math.sqrt(1 / 3), rel=1e-4)
    assign_advantages(episodes, group_size=3, normalize_std=True, unbiased_std=False)
    assert episodes[0].advantage == pytest.approx((2 / 3) / math.sqrt(2 / 9), rel=1e-4)


def test_train_subset_leaves_out_failed_samples_and_with_dynamic_sampling_all_equal_groups():
    # group 1: 1, 0, 0 (informative); group 2: 5, 5 and a failed sample (all equal among those that scored)
    episodes = _episodes([1.0, 0.0, 0.0, 5.0, 5.0, 1.0], errors={5: "failed"})
    assert [e.sample_id for e in train_subset(episodes)] == [10, 11, 12, 13, 14]
    assert [e.sample_id for e in train_subset(episodes, dynamic_sampling=True)] == [10, 11, 12]
    all_equal = _episodes([1.0, 1.0, 1.0])
    assert train_subset(all_equal, dynamic_sampling=True) == []


def test_a_rollout_whose_every_reward_failed_has_nothing_to_train_on():
    episodes = _episodes([0.0, 0.0, 0.0], errors={0: "a", 1: "b", 2: "c"})
    with pytest.raises(EmptyTrainBatch, match="every sample of this rollout failed its reward"):
        train_subset(episodes)


def test_rollout_summary_and_table():
    episodes = _episodes([1.0, 0.0, 0.0])
    rollout = Rollout(episodes, policy_version=4, accuracy=1 / 3, generate_s=0.5, score_s=0.1)
    assert rollout.mean_reward == pytest.approx(1 / 3)
    assert rollout.num_tokens == 6 and rollout.tokens_per_s == 12.0
    assert rollout.summary()["samples"] == 3
    assert list(rollout.to_pandas().sample_id) == [10, 11, 12]


def test_mean_reward_counts_only_the_samples_a_reward_scored():
    """A failed reward's sample and an unscorable one (every member gave None) carry a placeholder 0 that
    is not a score: the mean is over the others (TRL's nanmean), NaN when none scored."""
    episodes = _episodes([1.0, 0.5, 0.0], errors={2: "ValueError: bad"})
    episodes[1].rewards, episodes[1].reward = {}, 0.0  # no member scored it
    assert not episodes[1].scored and not episodes[2].scored and episodes[0].scored
    assert Rollout(episodes, 1, 0.0, 1.0, 0.1).mean_reward == 1.0
    failed = _episodes([0.0, 0.0, 0.0], errors={0: "a", 1: "b", 2: "c"})
    assert math.isnan(Rollout(failed, 1, 0.0, 1.0, 0.1).mean_reward)


def test_gdpo_keeps_a_group_whose_sums_tie_but_whose_rewards_differ_and_needs_no_weights():
    """Dynamic sampling under GDPO asks whether any reward varies in the group, not the weighted sum; scores that
    did not say their weights count each member once."""
    episodes = make_episodes(PROBLEMS, TEXTS, _completions([["a", "b", "c"], ["d", "e", "f"]]), 0, 0)
    components = {"x": [2.0, 0.0, 1.0, 1.0, 1.0, 1.0], "y": [0.0, 1.0, 0.5, 0.0, 0.0, 0.0]}
    apply_scores(episodes, Scores.combine(components, {"x": 1.0, "y": 2.0}, {}, 1))
    assert {e.reward for e in episodes[:3]} == {2.0}  # the first group's sums tie
    assign_advantages(episodes, 3, weights={"x": 1.0, "y": 2.0})
    assert episodes[0].advantage != 0
    assert [e.group_id for e in train_subset(episodes, True, decoupled=True)] == [0, 0, 0]
    assert train_subset(episodes, True) == []  # by the sums, both groups are flat
    assign_advantages(episodes, 3, weights={})
    names, table = reward_components(episodes, {})
    assert names == ["x", "y"]
    expected = decoupled(table.view(2, 3, 2), torch.tensor([1.0, 1.0])).flatten().tolist()
    assert [e.advantage for e in episodes] == pytest.approx(expected) and episodes[0].advantage != 0


def test_a_sample_no_reward_scored_gets_no_advantage_and_does_not_count_in_its_group():
    """Every member gave None ("no score for this sample", as TRL's accuracy_reward does): TRL's unscorable row.
    Its weighted sum of nothing is 0, but it is not a 0 the policy earned."""
    episodes = make_episodes(PROBLEMS[:1], TEXTS, _completions([["a", "b", "c", "d"]]), 0, 0)
    components = {"accuracy": [1.0, 0.0, None, 0.0], "format": [None, None, None, 1.0]}
    apply_scores(episodes, Scores.combine(components, {"accuracy": 1.0, "format": 0.5}, {}, 1))
    assert episodes[2].reward == 0.0 and episodes[2].rewards == {}
    assign_advantages(episodes, 4)
    assert episodes[2].advantage == 0
    rewards = torch.tensor([[1.0, 0.0, 0.5]])  # the other three, as TRL's nan-aware group statistics take them
    expected = ((rewards - rewards.mean()) / (rewards.std() + 1e-6)).flatten().tolist()
    assert [episodes[i].advantage for i in (0, 1, 3)] == pytest.approx(expected, rel=1e-5)
