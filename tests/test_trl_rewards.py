"""TRL's own reward functions (trl 1.16.0, `trl.rewards`) as forge_nb rewards, unchanged, on a
conversational dataset with the real SmolLM2-135M-Instruct: rollout, train, sync; each reward's score of
every sample is what TRL's function returns on the same completion."""

import pytest

import forge_nb
from tests.conftest import wait_no_children

trl_rewards = pytest.importorskip("trl.rewards")
pytestmark = pytest.mark.slow

MAX_TOKENS = 16
# Shaped like trl-lib/DeepMath-103K: chat-message prompts and a `solution`; the last one cannot be parsed by
# math_verify, so accuracy_reward returns None ("no score") for its samples.
ROWS = [
    {
        "prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the answer in \\boxed{{}}."}],
        "solution": f"${a + b}$" if a else "no parseable answer here",
    }
    for a, b in [(3, 4), (12, 7), (25, 17), (8, 9), (0, 1), (30, 12)]
]


def trl_functions() -> dict:
    """TRL's shipped rewards by forge_nb member name ("reward": replaces the built-in answer check)."""
    return {
        "reward": trl_rewards.accuracy_reward,
        "think": trl_rewards.think_format_reward,
        "repetition": trl_rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0),
        "overlong": trl_rewards.get_soft_overlong_punishment(max_completion_len=MAX_TOKENS, soft_punish_cache=8),
        "reasoning": trl_rewards.reasoning_accuracy_reward,
    }


@pytest.fixture(scope="module")
def smollm2():
    s = forge_nb.up(
        model="smollm2-135m-instruct",
        task=ROWS,
        prompts_per_step=2,
        group_size=2,
        max_tokens=MAX_TOKENS,
        eval_fraction=0.2,
        lr=1e-5,
        timeout_s=30.0,  # math_verify's first parse in a fresh proc
    )
    yield s
    s.down()
    assert wait_no_children() == []


def test_trl_rewards_run_unchanged_and_score_as_trl_does(smollm2):
    s = smollm2
    s.rollout()  # recent samples for the rewards below to be validated on
    for name, fn in trl_functions().items():
        s.set_reward(fn, name=name if name != "reward" else None)
    r = s.rollout()
    assert len(r.episodes) == 4 and all(e.reward_error is None for e in r.episodes)
    completions = [[{"role": "assistant", "content": e.completion}] for e in r.episodes]
    solutions = [e.extras["solution"] for e in r.episodes]
    ids = [e.completion_ids for e in r.episodes]
    for name, fn in trl_functions().items():
        expected = fn(completions=completions, solution=solutions, completion_ids=ids)
        got = [e.rewards.get(name) for e in r.episodes]  # None: TRL's "no score for this sample"
        assert [g is None for g in got] == [x is None for x in expected], name
        assert [g for g in got if g is not None] == pytest.approx([x for x in expected if x is not None]), name
    assert None in trl_rewards.accuracy_reward(completions, solutions)  # the seeded batch has the unparseable row
    for e in r.episodes:  # weights 1: the reward is the sum of the scores there are
        assert e.reward == pytest.approx(sum(e.rewards.values()))
    metrics = s.train(r)
    assert metrics["policy_version"] == 1
    assert s.sync()["version"] == 1
