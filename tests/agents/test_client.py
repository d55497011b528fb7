"""The chat client with a scripted backend: what is recorded, what is masked, and how calls are batched."""

import asyncio
import copy
from collections.abc import Callable

import pytest
from openai.types.chat import ChatCompletion

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import AgentClient, Limits
from forge_nb.agents.tools import ToolSet
from forge_nb.agents.trajectory import Trajectory
from tests.agents.conftest import SCRIPTED_LOGPROB, ScriptedBackend, multiply

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'


def calls_then_answers(prompt: str) -> str:
    """Call the tool first; answer with the tool's result once it is in the prompt."""
    if "<tool_response>" in prompt:
        return "The answer is " + prompt.split("<tool_response>\n")[-1].split("\n")[0] + "."
    return CALL


async def tool_loop(client: AgentClient, tools: ToolSet, question: str) -> list:
    messages = [{"role": "user", "content": question}]
    while True:
        response = await client.chat.completions.create(messages=messages, tools=tools, max_tokens=64)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return [response, messages]
        messages.extend(await tools.run(message.tool_calls))


def run_tool_loop(tokenizer, backend):
    trajectory = Trajectory(row={})
    client = AgentClient(GenerationBatcher(backend, window_s=0.001), tokenizer, trajectory)
    tools = ToolSet([multiply], on_result=trajectory.record_tool)
    response, messages = asyncio.run(tool_loop(client, tools, "What is 6 times 7?"))
    return trajectory, response, messages


def test_a_tool_call_runs_the_tool_and_only_the_models_tokens_are_trained(tokenizer):
    backend = ScriptedBackend(tokenizer, calls_then_answers)
    trajectory, response, messages = run_tool_loop(tokenizer, backend)
    assert isinstance(response, ChatCompletion) and response.choices[0].message.content == "The answer is 42."
    assert messages[2] == {"role": "tool", "tool_call_id": "call_0_0", "name": "multiply", "content": "42"}
    assert (trajectory.num_turns, trajectory.tool_calls, trajectory.tool_errors) == (2, 1, 0)

    ids, mask, logprobs = trajectory.token_ids(), trajectory.loss_mask(), trajectory.logprobs()
    assert len(ids) == len(mask) == len(logprobs)
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == f"{CALL}<|im_end|>The answer is 42.<|im_end|>"  # exactly the two replies
    masked = tokenizer.decode([t for t, m in zip(ids, mask) if not m])
    assert "<tool_response>\n42\n</tool_response>" in masked and "What is 6 times 7?" in masked
    assert all(lp == SCRIPTED_LOGPROB for lp, m in zip(logprobs, mask) if m)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)


def test_the_trajectory_is_the_last_prompt_the_backend_got_plus_its_last_output(tokenizer):
    backend = ScriptedBackend(tokenizer, calls_then_answers)
    trajectory, _, _ = run_tool_loop(tokenizer, backend)
    last_prompt = backend.batches[-1][0]
    assert trajectory.last_prompt_ids() == last_prompt
    assert trajectory.token_ids() == last_prompt + backend.outputs[tuple(last_prompt)]
    first_prompt = backend.batches[0][0]
    assert last_prompt[: len(first_prompt)] == first_prompt  # the second prompt extends the first


def test_concurrent_calls_of_several_trajectories_go_to_the_backend_as_one_batch(tokenizer):
    backend = ScriptedBackend(tokenizer, calls_then_answers)
    batcher = GenerationBatcher(backend, window_s=0.01)

    async def many():
        jobs = []
        for i in range(6):
            trajectory = Trajectory(row={}, sample=i)
            client = AgentClient(batcher, tokenizer, trajectory)
            jobs.append(tool_loop(client, ToolSet([multiply]), f"What is {i} times 7?"))
        return await asyncio.gather(*jobs)

    results = asyncio.run(many())
    assert [r[0].choices[0].message.content for r in results][:2] == ["The answer is 42.", "The answer is 42."]
    assert batcher.batch_sizes == [6, 6]  # turn 1 of all six together, then turn 2 of all six
    assert [len(b) for b in backend.batches] == [6, 6]


def test_calls_with_different_sampling_are_batched_apart(tokenizer):
    backend = ScriptedBackend(tokenizer, lambda prompt: "ok")
    batcher = GenerationBatcher(backend, window_s=0.01)

    async def two_temperatures():
        clients = [AgentClient(batcher, tokenizer, Trajectory(row={})) for _ in range(4)]
        messages = [{"role": "user", "content": "hi"}]
        return await asyncio.gather(
            *(c.chat.completions.create(messages=messages, temperature=0.5 * (i % 2)) for i, c in enumerate(clients))
        )

    asyncio.run(two_temperatures())
    assert sorted(batcher.batch_sizes) == [2, 2]


def two_calls(client: AgentClient, second: Callable[[list, object], tuple[list, object]]):
    """A first call on "hi", then a second on `second(messages, reply)` -> (messages, tools) of call 2."""

    async def run():
        messages = [{"role": "user", "content": "hi"}]
        reply = (await client.chat.completions.create(messages=messages, tools=[multiply])).choices[0].message
        messages, tools = second(messages, reply)
        await client.chat.completions.create(messages=messages, tools=tools)

    asyncio.run(run())


@pytest.mark.parametrize(
    ("second", "why"),
    [
        (
            lambda m, r: ([{"role": "user", "content": "hello"}, r, {"role": "user", "content": "and?"}], [multiply]),
            "message 0 (user) changed",
        ),
        (lambda m, r: ([*m, r, {"role": "user", "content": "and?"}], None), "the tools changed"),
        (lambda m, r: ([{"role": "user", "content": "summary: hi"}], [multiply]), "message 0 (user) changed"),
        (lambda m, r: ([*m, {"role": "user", "content": "and?"}], [multiply]), "not the assistant's reply"),
    ],
    ids=["edited", "tools-changed", "history-trimmed", "reply-not-appended"],
)
def test_a_call_that_does_not_extend_the_conversation_starts_a_new_segment(tokenizer, second, why):
    backend = ScriptedBackend(tokenizer, lambda p: "ok")
    trajectory = Trajectory(row={})
    two_calls(AgentClient(GenerationBatcher(backend, window_s=0.001), tokenizer, trajectory), second)
    first, new = trajectory.turns
    assert (first.segment, new.segment, first.new_segment) == (0, 1, None) and why in new.new_segment
    assert new.prompt_delta_ids == backend.batches[1][0]  # the new segment's delta is its whole prompt
    segments = trajectory.segments()
    assert [s.num_turns for s in segments] == [1, 1] and trajectory.summary()["segments"] == 2
    for segment, prompt in zip(segments, backend.batches):
        assert segment.prompt_ids == prompt[0] and segment.completion_ids() == backend.outputs[tuple(prompt[0])]
        assert segment.completion_mask() == [1] * len(segment.completion_ids())


def test_a_conversation_that_extends_stays_one_segment(tokenizer):
    trajectory = Trajectory(row={})
    client = AgentClient(GenerationBatcher(ScriptedBackend(tokenizer, lambda p: "ok")), tokenizer, trajectory)
    two_calls(client, lambda m, r: ([*m, r, {"role": "user", "content": "and?"}], [multiply]))
    assert [t.segment for t in trajectory.turns] == [0, 0] and trajectory.segments() == [trajectory]


def test_the_calls_max_tokens_is_capped_by_the_limits(tokenizer):
    backend = ScriptedBackend(tokenizer, lambda p: "one two three four five six seven eight nine ten")
    trajectory = Trajectory(row={})
    client = AgentClient(GenerationBatcher(backend), tokenizer, trajectory, Limits(max_tokens=4))
    response = asyncio.run(client.chat.completions.create(messages=[{"role": "user", "content": "count"}]))
    assert response.choices[0].finish_reason == "length" and response.usage.completion_tokens == 4
    assert trajectory.turns[0].finish_reason == "length"


def test_a_template_that_renders_tools_natively_keeps_the_stream_exact(tokenizer):
    from tests.agents.test_tool_calls import TOOL_TEMPLATE

    native = copy.copy(tokenizer)
    native.chat_template = TOOL_TEMPLATE  # writes a tool result as "<|im_start|>tool\n42<|im_end|>"

    def reply(prompt: str) -> str:
        if "<|im_start|>tool\n" in prompt:
            return "The answer is " + prompt.split("<|im_start|>tool\n")[-1].split("<|im_end|>")[0] + "."
        return CALL

    backend = ScriptedBackend(native, reply)
    trajectory, response, _ = run_tool_loop(native, backend)
    assert response.choices[0].message.content == "The answer is 42."
    last = backend.batches[-1][0]
    assert trajectory.token_ids() == last + backend.outputs[tuple(last)]
    assert native.decode(backend.batches[0][0]).startswith('<|im_start|>system\n<tools>{"type": "function"')


def test_an_async_backend_is_awaited(tokenizer):
    scripted = ScriptedBackend(tokenizer, lambda p: "async ok")

    async def backend(prompt_ids, sampling):
        await asyncio.sleep(0)
        return scripted(prompt_ids, sampling)

    client = AgentClient(GenerationBatcher(backend), tokenizer, Trajectory(row={}))
    response = asyncio.run(client.chat.completions.create(messages=[{"role": "user", "content": "hi"}]))
    assert response.choices[0].message.content == "async ok"


def test_a_backend_failure_reaches_every_waiting_call(tokenizer):
    def broken(prompt_ids, sampling):
        raise RuntimeError("prompt longer than the model's context")

    batcher = GenerationBatcher(broken)

    async def two():
        clients = [AgentClient(batcher, tokenizer, Trajectory(row={})) for _ in range(2)]
        messages = [{"role": "user", "content": "hi"}]
        return await asyncio.gather(
            *(c.chat.completions.create(messages=messages) for c in clients), return_exceptions=True
        )

    errors = asyncio.run(two())
    assert [str(e) for e in errors] == ["prompt longer than the model's context"] * 2
    assert batcher.batch_sizes == [2]


def test_a_stop_string_ends_the_content_but_its_tokens_stay_recorded(tokenizer):
    class StopsAtEnd(ScriptedBackend):
        def __call__(self, prompt_ids, sampling):
            out = super().__call__(prompt_ids, sampling)
            assert sampling.stop == ("END",)
            return out

    backend = StopsAtEnd(tokenizer, lambda p: "42 END")
    trajectory = Trajectory(row={})
    client = AgentClient(GenerationBatcher(backend), tokenizer, trajectory)
    messages = [{"role": "user", "content": "answer"}]
    response = asyncio.run(client.chat.completions.create(messages=messages, stop="END"))
    assert response.choices[0].message.content == "42 "
    assert trajectory.turns[0].text == "42 END"
