"""The runner with a scripted backend: groups, return values, limits and finish reasons, environments."""

import asyncio
import re
import time

import pytest

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import Limits
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.runner import run_rollouts
from forge_nb.agents.tasks import GuessTheNumber
from tests.agents.conftest import ScriptedBackend

ROWS = [{"q": "a"}, {"q": "b"}, {"q": "c"}]
SERVED: list[Endpoint | None] = [None]  # the endpoint of the running test's `client` parameter


@pytest.fixture(autouse=True, params=["in_process", "openai"])
def client(request):
    """Every test twice: with the in-process client, and with a real AsyncOpenAI over the HTTP endpoint."""
    SERVED[0] = Endpoint().start() if request.param == "openai" else None
    yield request.param
    if SERVED[0] is not None:
        SERVED[0].stop()
        assert not SERVED[0].trajectories  # every trajectory was closed when its rollout ended


def run(tokenizer, reply, rows=ROWS, **kwargs):
    backend = ScriptedBackend(tokenizer, reply)
    batcher = GenerationBatcher(backend, window_s=0.01)
    return asyncio.run(run_rollouts(batcher, tokenizer, rows, endpoint=SERVED[0], **kwargs)), batcher


async def ask_once(client, row, **context):
    response = await client.chat.completions.create(messages=[{"role": "user", "content": row["q"]}])
    return {"reward": float(row["q"] == "b"), "answer": response.choices[0].message.content}


async def chat_forever(client, row, **context):
    messages = [{"role": "user", "content": row["q"]}]
    while True:
        response = await client.chat.completions.create(messages=messages)
        messages += [response.choices[0].message, {"role": "user", "content": "Again."}]


def test_g_trajectories_per_row_in_row_major_order_with_the_returned_reward(tokenizer):
    trajectories, batcher = run(tokenizer, lambda p: "fine", rollout=ask_once, group_size=2)
    assert [(t.group, t.sample, t.row["q"]) for t in trajectories] == [
        (0, 0, "a"),
        (0, 1, "a"),
        (1, 0, "b"),
        (1, 1, "b"),
        (2, 0, "c"),
        (2, 1, "c"),
    ]
    assert [t.reward for t in trajectories] == [0.0, 0.0, 1.0, 1.0, 0.0, 0.0]
    assert all(t.finish_reason == "stop" and t.info == {"answer": "fine"} for t in trajectories)
    assert batcher.batch_sizes == [6]


def test_a_rollout_may_return_a_float_or_none_and_add_per_turn_rewards(tokenizer):
    async def float_reward(client, row, trajectory, **context):
        await client.chat.completions.create(messages=[{"role": "user", "content": row["q"]}])
        trajectory.add_reward(0.25)
        return 0.5 if row["q"] == "a" else None

    trajectories, _ = run(tokenizer, lambda p: "ok", rollout=float_reward)
    assert [t.reward for t in trajectories] == [0.5, None, None]
    assert [t.total_reward for t in trajectories] == [0.75, 0.25, 0.25]


def test_max_turns_ends_a_rollout_that_never_stops(tokenizer):
    trajectories, _ = run(tokenizer, lambda p: "more", rollout=chat_forever, limits=Limits(max_turns=3))
    assert all(t.finish_reason == "max_turns" and t.num_turns == 3 for t in trajectories)
    assert all(t.reward is None for t in trajectories)


def test_the_total_token_budget_ends_a_rollout_with_max_tokens(tokenizer):
    limits = Limits(max_turns=50, max_total_tokens=120, max_tokens=16)
    trajectories, _ = run(tokenizer, lambda p: "word " * 12, rollout=chat_forever, limits=limits)
    for t in trajectories:
        assert t.finish_reason == "max_tokens" and t.num_tokens <= 120 and 1 < t.num_turns < 50


def test_a_rollout_that_raises_ends_with_error_and_the_others_go_on(tokenizer):
    async def fails_on_b(client, row, **context):
        await client.chat.completions.create(messages=[{"role": "user", "content": row["q"]}])
        if row["q"] == "b":
            raise KeyError("answer")
        return 1.0

    trajectories, _ = run(tokenizer, lambda p: "ok", rollout=fails_on_b)
    assert [t.finish_reason for t in trajectories] == ["stop", "error", "stop"]
    assert trajectories[1].error == "KeyError: 'answer'" and trajectories[1].num_turns == 1


def test_a_hanging_tool_gives_an_error_observation_and_the_rollout_goes_on(tokenizer):
    def lookup(key: str) -> str:
        """Looks a key up (hangs on 'slow', raises on 'bad').

        Args:
            key: The key.
        """
        if key == "bad":
            raise RuntimeError("no such key")
        if key == "slow":
            time.sleep(3)
        return key.upper()

    def reply(prompt: str) -> str:
        if prompt.count("<tool_response>") >= 3:
            return "done"
        key = ["slow", "bad", "nope"][prompt.count("<tool_response>")]
        name = "missing" if key == "nope" else "lookup"
        return f'<tool_call>{{"name": "{name}", "arguments": {{"key": "{key}"}}}}</tool_call>'

    async def agent(client, row, tools, **context):
        messages = [{"role": "user", "content": "look it up"}]
        observations = []
        while True:
            message = (await client.chat.completions.create(messages=messages, tools=tools)).choices[0].message
            messages.append(message)
            if not message.tool_calls:
                return {"reward": 1.0, "observations": observations}
            results = await tools.run(message.tool_calls)
            observations += [r["content"] for r in results]
            messages.extend(results)

    trajectories, _ = run(tokenizer, reply, rows=[{}], rollout=agent, tools=[lookup], tool_timeout=0.3)
    (t,) = trajectories
    assert t.finish_reason == "stop" and t.reward == 1.0 and t.num_turns == 4
    assert (t.tool_calls, t.tool_errors) == (3, 3)
    slow, bad, missing = t.info["observations"]
    assert "timed out after 0.3 s" in slow and "raised RuntimeError: no such key" in bad
    assert "unknown tool 'missing'" in missing


def guess_upwards(prompt: str) -> str:
    """Guesses 10, then moves by one in the direction of the feedback."""
    guesses = [int(g) for g in re.findall(r"<\|im_start\|>assistant\n(\d+)", prompt)]
    if not guesses:
        return "10"
    return str(guesses[-1] + (1 if prompt.rstrip().endswith("Higher.<|im_end|>\n<|im_start|>assistant") else -1))


def test_an_environment_is_driven_turn_by_turn_until_done(tokenizer):
    rows = [{"target": 12}, {"target": 8}, {"target": 10}]
    trajectories, _ = run(tokenizer, guess_upwards, rows=rows, env=GuessTheNumber, limits=Limits(max_turns=5))
    assert [t.finish_reason for t in trajectories] == ["stop", "stop", "stop"]
    assert [t.num_turns for t in trajectories] == [3, 3, 1]
    assert [t.turn_rewards for t in trajectories] == [[0.0, 0.0, 1.0], [0.0, 0.0, 1.0], [1.0]]
    feedback = trajectories[0].messages
    assert [m["content"] for m in feedback if m["role"] == "user"][1:] == ["Higher.", "Higher."]


def test_an_environment_that_is_never_done_stops_at_max_turns(tokenizer):
    trajectories, _ = run(tokenizer, lambda p: "no idea", rows=[{"target": 3}], env=GuessTheNumber)
    (t,) = trajectories
    assert t.finish_reason == "max_turns" and t.num_turns == Limits().max_turns and t.total_reward == 0.0


def test_a_rollout_that_returns_after_its_reply_was_cut_by_the_budget_finishes_with_max_tokens(tokenizer):
    async def one_reply(client, row, **context):
        await client.chat.completions.create(messages=[{"role": "user", "content": row["q"]}])
        return 1.0

    limits = Limits(max_total_tokens=40, max_tokens=64)  # the prompt is ~30 tokens: room for ~10
    trajectories, _ = run(tokenizer, lambda p: "word " * 30, rollout=one_reply, limits=limits)
    for t in trajectories:
        assert t.finish_reason == "max_tokens" and t.reward == 1.0 and t.num_tokens == 40
        assert t.turns[0].finish_reason == "length"


def test_a_rollout_that_is_not_async_is_refused_up_front(tokenizer):
    def not_async(client, row, **context):
        return 1.0

    with pytest.raises(TypeError, match="must be `async def rollout"):
        run(tokenizer, lambda p: "ok", rollout=not_async)


def test_an_object_with_an_async_call_is_a_rollout(tokenizer):
    class Agent:
        async def __call__(self, client, row, **context):
            await client.chat.completions.create(messages=[{"role": "user", "content": row["q"]}])
            return 0.5

    trajectories, _ = run(tokenizer, lambda p: "ok", rollout=Agent())
    assert [t.reward for t in trajectories] == [0.5, 0.5, 0.5]
