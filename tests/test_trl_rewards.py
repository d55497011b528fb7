"""TRL's own reward functions (trl 1.16.0, `trl.rewards`) as forge_nb rewards, unchanged, on a
conversational dataset with the real SmolLM2-135M-Instruct, configured by a TRL GRPOConfig: rollout,
train, sync; each reward's score of every sample is what TRL's function returns on the same completion."""

import pytest

from forge_nb.rewards import set_reward_funcs
from forge_nb.session import Session
from tests.conftest import wait_no_children

trl = pytest.importorskip("trl")
trl_rewards = pytest.importorskip("trl.rewards")
pytestmark = pytest.mark.slow

MAX_TOKENS = 16
# Shaped like trl-lib/DeepMath-103K: chat-message prompts and a `solution`. Most solutions here cannot be parsed
# by math_verify, so accuracy_reward returns None ("no score") for their samples.
ROWS = [
    {
        "prompt": [{"role": "user", "content": f"What is {a} + {b}? Put the answer in \\boxed{{}}."}],
        "solution": f"${a + b}$" if a > 20 else "no parseable answer here",
    }
    for a, b in [(3, 4), (12, 7), (25, 17), (8, 9), (1, 1), (30, 12)]
]


def trl_reward_funcs() -> list:
    """Every reward function TRL ships for GRPO (`trl.rewards`)."""
    return [
        trl_rewards.accuracy_reward,
        trl_rewards.think_format_reward,
        trl_rewards.get_repetition_penalty_reward(ngram_size=2, max_penalty=-1.0),
        trl_rewards.get_soft_overlong_punishment(max_completion_len=MAX_TOKENS, soft_punish_cache=8),
        trl_rewards.reasoning_accuracy_reward,
        trl_rewards.get_cosine_scaled_reward(max_len=MAX_TOKENS),
    ]


@pytest.fixture(scope="module")
def smollm2():
    args = trl.GRPOConfig(
        use_cpu=True, num_generations=2, per_device_train_batch_size=4, max_completion_length=MAX_TOKENS,
        learning_rate=1e-5, loss_type="grpo",
    )  # fmt: skip
    s = Session.up(
        model="smollm2-135m-instruct",
        task=ROWS,
        eval_fraction=0.2,
        timeout_s=30.0,  # math_verify's first parse in a fresh proc
        **args.to_dict(),
    )
    yield s
    s.down()
    assert wait_no_children() == []


def test_trl_rewards_run_unchanged_and_score_as_trl_does(smollm2):
    s = smollm2
    a = s.config.algorithm
    assert (a.prompts_per_step, a.group_size, a.lr, s.config.engine.max_tokens) == (2, 2, 1e-5, MAX_TOKENS)
    s.rollout()  # recent samples for the rewards below to be validated on
    weights = [1.0, 0.5, 1.0, 1.0, 0.5, 0.25]
    set_reward_funcs(s, trl_reward_funcs(), weights)
    r = s.rollout()
    assert len(r.episodes) == 4 and all(e.reward_error is None for e in r.episodes)
    completions = [[{"role": "assistant", "content": e.completion}] for e in r.episodes]
    solutions = [e.extras["solution"] for e in r.episodes]
    ids = [e.completion_ids for e in r.episodes]
    names = ["accuracy_reward", "think_format_reward", "repetition_penalty_reward"]
    names += ["soft_overlong_punishment_reward", "reasoning_accuracy_reward", "cosine_scaled_reward"]
    for name, fn in zip(names, trl_reward_funcs()):
        expected = fn(completions=completions, solution=solutions, completion_ids=ids)
        got = [e.rewards.get(name) for e in r.episodes]  # None: TRL's "no score for this sample"
        assert [g is None for g in got] == [x is None for x in expected], name
        assert [g for g in got if g is not None] == pytest.approx([x for x in expected if x is not None]), name
    assert None in trl_rewards.accuracy_reward(completions, solutions)  # the seeded batch has unparseable rows
    weights = dict(zip(names, weights))
    for e in r.episodes:  # the reward is the weighted sum of the scores there are, as TRL's nansum
        assert set(e.rewards) <= set(names)
        assert e.reward == pytest.approx(sum(weights[n] * v for n, v in e.rewards.items()))
    metrics = s.train(r)
    assert metrics["policy_version"] == 1
    assert s.sync()["version"] == 1
