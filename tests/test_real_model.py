"""The real SmolLM2-135M-Instruct through the whole path: a dataset of chat messages written by the test,
two weighted rewards (one reads a dataset column), rollout / train / sync and evaluation, on both engines."""

import json

import pandas as pd
import pytest

from forge_nb.session import Session
from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow

PAIRS = [(3, 4), (12, 7), (25, 17), (8, 9), (30, 12), (5, 6), (14, 21), (9, 9), (40, 2), (11, 11)]


def write_dataset(path) -> None:
    rows = [
        {
            "messages": [{"role": "user", "content": f"What is {a} + {b}? Answer with the number only."}],
            "answer": str(a + b),
            "max_chars": 12 if a < 10 else 20,  # read by the second reward
        }
        for a, b in PAIRS
    ]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def brevity(prompt, completion, target, max_chars):
    return 1.0 if len(completion.strip()) <= max_chars else 0.0


@pytest.mark.parametrize("engine", ["torch", "vllm"])
def test_real_model_rollout_train_sync_and_eval_with_two_weighted_rewards(tmp_path, engine):
    write_dataset(tmp_path / "sums.jsonl")
    s = Session.up(
        model="smollm2-135m-instruct",
        task=str(tmp_path / "sums.jsonl"),
        prompt_column="messages",
        engine=engine,
        prompts_per_step=2,
        group_size=4,
        max_tokens=24,
        eval_fraction=0.2,
        lr=1e-5,
    )
    try:
        assert s.status()["engine"] == engine
        version = s.set_reward(brevity, name="brief", weight=0.2)
        r = s.rollout()
        assert len(r.episodes) == 8 and {e.reward_version for e in r.episodes} == {version}
        for e in r.episodes:
            assert e.prompt.startswith("<|im_start|>system\n") and e.prompt.endswith("<|im_start|>assistant\n")
            assert e.reward == pytest.approx(e.rewards["reward"] + 0.2 * e.rewards["brief"])
            assert len(e.completion_ids) <= 24 and e.finish_reason in ("stop", "length")
        table = s.samples(8)
        assert table.prompt.str.contains("<|im_start|>user\nWhat is").all()
        for column in (
            "completion",
            "target",
            "reward",
            "reward/reward",
            "reward/brief",
            "policy_version",
            "reward_version",
            "loss_version",
        ):
            assert column in table.columns
        metrics = s.train(r)
        assert metrics["policy_version"] == 1 and metrics["tokens"] == r.num_tokens
        report = s.sync()
        assert report["version"] == 1 and report["bytes"] > 500e6
        result = s.evaluate()
        assert result["policy_version"] == 1 and result["eval_samples"] == 2
        assert {"heldout_accuracy", "eval_reward", "eval_reward/reward", "eval_reward/brief"} <= set(result)
        assert isinstance(s.metrics_stream.to_pandas("rollout").truncated.iloc[-1], float)
        assert pd.api.types.is_integer_dtype(table.index)
    finally:
        s.down()
    assert wait_no_children() == []
