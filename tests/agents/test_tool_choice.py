"""`tool_choice`: what each choice forces the reply to start with, and a forced call through the client (its
opening is prompt, not policy; the conversation goes on as one token stream)."""

from __future__ import annotations

import asyncio

import openai
import pytest

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import AgentClient
from forge_nb.agents.tool_choice import forced_opening, parses_calls
from forge_nb.agents.tools import ToolSet, tool_schema
from forge_nb.agents.trajectory import Trajectory
from tests.agents.conftest import ScriptedBackend, add, multiply

OPENING = '<tool_call>\n{"name": "multiply", "arguments":'


@pytest.mark.parametrize(
    ("choice", "tools", "opening"),
    [
        (None, [multiply], ""),
        ("auto", [multiply], ""),
        ("none", [multiply], ""),
        ("required", [multiply], OPENING),
        ("required", [multiply, add], '<tool_call>\n{"name": "'),
        ({"type": "function", "function": {"name": "add"}}, [multiply, add], OPENING.replace("multiply", "add")),
    ],
    ids=["unset", "auto", "none", "required-one-tool", "required-two-tools", "named"],
)
def test_what_each_choice_forces(choice, tools, opening):
    assert forced_opening(choice, [tool_schema(t) for t in tools]) == opening


@pytest.mark.parametrize(
    ("choice", "tools", "says"),
    [
        ("required", [], "needs tools"),
        ({"type": "function", "function": {"name": "divide"}}, [multiply], "'divide', which is not one of"),
        ({"type": "allowed_tools", "allowed_tools": {}}, [multiply], "is not served"),
        ("always", [multiply], "is not served"),
    ],
    ids=["required-without-tools", "unknown-name", "allowed-tools", "unknown-string"],
)
def test_a_choice_that_cannot_be_served_is_refused_saying_why(choice, tools, says):
    with pytest.raises(ValueError, match=says):
        forced_opening(choice, [tool_schema(t) for t in tools])


def test_calls_are_parsed_unless_none_or_without_tools():
    schemas = [tool_schema(multiply)]
    assert forced_opening(openai.omit, schemas) == forced_opening(openai.NOT_GIVEN, schemas) == ""  # not given
    assert parses_calls("required", schemas) and parses_calls(None, schemas)
    assert not parses_calls("none", schemas) and not parses_calls("auto", [])


def answers_in_text_unless_forced(prompt: str) -> str:
    """A model that would answer in words; once its reply was started as a call, it completes the call."""
    if prompt.endswith(OPENING):
        return ' {"a": 6, "b": 7}}\n</tool_call>'
    if "<tool_response>" in prompt:
        return "It is 42."
    return "I think it is 42."


def test_a_named_choice_makes_the_reply_a_call_whose_opening_is_prompt_and_the_rest_policy(tokenizer):
    backend = ScriptedBackend(tokenizer, answers_in_text_unless_forced)
    trajectory = Trajectory(row={})
    client = AgentClient(GenerationBatcher(backend, window_s=0.001), tokenizer, trajectory)
    tools = ToolSet([multiply], on_result=trajectory.record_tool)
    named = {"type": "function", "function": {"name": "multiply"}}

    async def conversation():
        messages = [{"role": "user", "content": "What is 6 times 7?"}]
        first = await client.chat.completions.create(messages=messages, tools=tools, tool_choice=named)
        messages.append(first.choices[0].message)
        messages.extend(await tools.run(first.choices[0].message.tool_calls))
        second = await client.chat.completions.create(messages=messages, tools=tools)
        return first, second

    first, second = asyncio.run(conversation())
    call = first.choices[0].message.tool_calls[0]
    assert (first.choices[0].finish_reason, call.function.name, call.function.arguments) == (
        "tool_calls",
        "multiply",
        '{"a": 6, "b": 7}',
    )
    assert trajectory.turns[0].text.startswith(OPENING)  # what the rewards read: the whole call
    assert second.choices[0].message.content == "It is 42." and trajectory.num_segments == 1
    ids, mask = trajectory.token_ids(), trajectory.loss_mask()
    trained = tokenizer.decode([t for t, m in zip(ids, mask) if m])
    assert trained == ' {"a": 6, "b": 7}}\n</tool_call><|im_end|>It is 42.<|im_end|>'  # the opening is not
    assert tokenizer.decode(trajectory.turns[0].prompt_delta_ids).endswith(OPENING)
    last_prompt = backend.batches[-1][0]  # one token stream: what the backend got last, plus its output
    assert trajectory.token_ids() == last_prompt + backend.outputs[tuple(last_prompt)]
