"""Your own data and several weighted rewards on a real local mesh (the bundled model, fast)."""

import pytest

from forge_nb.live.capture import LiveCodeError
from forge_nb.session import Session
from tests.conftest import wait_no_children

ROWS = [{"q": f"{a}+{b}=", "a": str(a + b), "bonus": a % 2} for a in range(10, 40) for b in (3, 7)]


@pytest.fixture(scope="module")
def s():
    session = Session.up(
        task=ROWS,
        prompt_column="q",
        answer_column="a",
        eval_size=8,
        prompts_per_step=4,
        group_size=4,
        threads_per_proc=1,
        eval={"every": 2},
    )
    yield session
    session.down()
    assert wait_no_children() == []


def odd_bonus(prompt, completion, target, bonus):  # takes only the column it needs
    return float(bonus)


def test_rows_become_a_dataset_task_with_a_held_out_split(s):
    assert s.config.task.name == "dataset" and len(s.state.task.held_out) == 6  # 10% of 60 rows
    assert len(s.state.task.train) == 54


def test_a_second_weighted_reward_reads_a_column_and_is_logged_on_its_own(s):
    v = s.set_reward(odd_bonus, name="bonus", weight=0.5)
    members = s.registry.live("reward").members
    assert set(members) == {"reward", "bonus"} and members["bonus"].weight == 0.5
    r = s.rollout()
    assert {e.reward_version for e in r.episodes} == {v}
    for e in r.episodes:
        assert e.rewards["bonus"] == e.extras["bonus"]
        assert e.reward == pytest.approx(e.rewards["reward"] + 0.5 * e.rewards["bonus"])
    table = s.samples(8)
    assert {"reward", "reward/reward", "reward/bonus", "reward_version"} <= set(table.columns)


def test_a_weight_alone_can_change_and_a_member_can_be_removed_and_restored(s):
    with_bonus = s.set_reward(odd_bonus, name="bonus", weight=0.5)
    logged_only = s.set_reward(name="bonus", weight=0.0)
    r = s.rollout()
    assert all(e.reward == e.rewards["reward"] and "bonus" in e.rewards for e in r.episodes)
    removed = s.remove_reward("bonus")
    assert set(s.registry.live("reward").members) == {"reward"} and removed > logged_only
    assert all("bonus" not in e.rewards for e in s.rollout().episodes)
    s.set_reward(version=with_bonus)
    assert s.registry.live("reward").members["bonus"].weight == 0.5
    versions = s.versions("reward")
    assert list(versions.change)[-3:] == ["code", "weight", "removed"]


def test_reward_names_weights_and_the_loss_are_checked(s):
    with pytest.raises(LiveCodeError, match="weight must be a finite number"):
        s.set_reward(odd_bonus, name="bonus", weight=float("nan"))
    with pytest.raises(LiveCodeError, match="name must be a Python identifier"):
        s.set_reward(odd_bonus, name="my bonus")
    with pytest.raises(LiveCodeError, match="no reward member 'nope'"):
        s.set_reward(name="nope", weight=1.0)
    with pytest.raises(LiveCodeError, match="the loss is one function"):
        s.live_code.set(
            "loss", "def loss(logprobs, old_logprobs, advantages, mask):\n    return logprobs.sum()\n", name="other"
        )


def test_evaluation_scores_the_held_out_split_with_every_reward_and_runs_every_n_steps(s):
    s.set_reward(odd_bonus, name="bonus", weight=0.5)
    result = s.evaluate()
    assert result["eval_samples"] == 6 and 0.0 <= result["heldout_accuracy"] <= 1.0
    assert {"eval_reward", "eval_reward/reward", "eval_reward/bonus", "truncated"} <= set(result)
    sampled = s.evaluate(greedy=False)  # this call only: eval.samples_per_prompt (4) samples per problem
    assert sampled["eval_samples"] == 6 * 4 and sampled["eval_greedy"] == 0.0 and result["eval_greedy"] == 1.0
    evals_before = len(s.metrics_stream.rows("eval"))
    start = s.step_count
    s.step(4)
    expected = len([k for k in range(start + 1, start + 5) if k % 2 == 0])
    assert len(s.metrics_stream.rows("eval")) - evals_before == expected
