"""The OpenAI-compatible endpoint with a scripted backend: a real `openai.AsyncOpenAI` and plain HTTP
against it; the token, malformed requests, closed trajectories, the raw completions route, the port; what it
refuses (no token, bytes that are not HTTP, silent connections) counted while it goes on serving."""

import asyncio
import json
import os
import socket
import time

import openai
import pytest
import requests

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import AgentClient, Limits
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.tools import tool_schema
from forge_nb.agents.trajectory import Trajectory
from forge_nb.runtime import http_thread
from forge_nb.runtime.refusals import REFUSED
from tests.agents.conftest import ScriptedBackend, multiply

CALL = '<tool_call>\n{"name": "multiply", "arguments": {"a": 6, "b": 7}}\n</tool_call>'
RESPONSES_TOOL = {
    "type": "function",
    "name": "multiply",
    "description": "Multiply two integers.",
    "parameters": {"type": "object", "properties": {"a": {"type": "integer"}, "b": {"type": "integer"}}},
    "strict": False,
}


@pytest.fixture
def served(tokenizer):
    """An endpoint with one open trajectory -> (endpoint, trajectory id, trajectory, backend)."""
    endpoint = Endpoint().start()
    backend = ScriptedBackend(tokenizer, lambda p: "42" if "<tool_response>" in p else CALL)
    trajectory = Trajectory(row={})
    tid = endpoint.open(AgentClient(GenerationBatcher(backend, window_s=0.001), tokenizer, trajectory, Limits(4)))
    yield endpoint, tid, trajectory, backend
    endpoint.stop()


def post(endpoint, tid, route, body, token=None):
    headers = {"Authorization": f"Bearer {token or endpoint.token}"}
    return requests.post(f"{endpoint.base_url(tid)}/{route}", json=body, headers=headers, timeout=30)


def test_a_real_async_openai_client_runs_a_tool_loop_recorded_token_for_token(served):
    endpoint, tid, trajectory, backend = served

    async def loop():
        client = endpoint.client(tid)
        assert isinstance(client, openai.AsyncOpenAI) and str(client.base_url).endswith(f"/t/{tid}/v1/")
        messages = [{"role": "user", "content": "What is 6 times 7?"}]
        first = await client.chat.completions.create(model="any", messages=messages, tools=[multiply])
        call = first.choices[0].message.tool_calls[0]
        assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "multiply"
        messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        second = await client.chat.completions.create(model="any", messages=messages, tools=[multiply])
        await client.close()
        return second.choices[0].message.content

    assert asyncio.run(loop()) == "42"
    assert [t.segment for t in trajectory.turns] == [0, 0]
    assert trajectory.last_prompt_ids() == backend.batches[-1][0]  # the stream the backend saw, not re-tokenised


def test_requests_without_the_token_or_to_a_closed_trajectory_are_refused(served):
    endpoint, tid, _, _ = served
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    assert requests.post(f"{endpoint.base_url(tid)}/chat/completions", json=body, timeout=30).status_code == 401
    wrong = post(endpoint, tid, "chat/completions", body, token="forge-wrong")
    assert wrong.status_code == 401 and wrong.json()["error"]["type"] == "authentication_error"
    endpoint.close(tid)
    closed = post(endpoint, tid, "chat/completions", body)
    assert closed.status_code == 404 and "no open trajectory" in closed.json()["error"]["message"]


def refused(endpoint: Endpoint) -> dict[str, int]:
    prefix = f"{endpoint.name}: "
    return {k.removeprefix(prefix): n for k, n in REFUSED.totals().items() if k.startswith(prefix)}


def test_no_token_garbage_and_silent_connections_are_refused_and_counted_while_it_serves(tokenizer, monkeypatch):
    monkeypatch.setattr(http_thread, "FIRST_BYTES_S", 0.5)
    endpoint = Endpoint().start()
    backend = ScriptedBackend(tokenizer, lambda p: "42")
    tid = endpoint.open(AgentClient(GenerationBatcher(backend, window_s=0.001), tokenizer, Trajectory(row={})))
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    try:
        silent = [socket.create_connection(("127.0.0.1", endpoint.port)) for _ in range(50)]
        with socket.create_connection(("127.0.0.1", endpoint.port)) as garbage:
            garbage.sendall(os.urandom(2048) + b"\r\n\r\n")
            assert garbage.recv(4096).startswith(b"HTTP/1.1 400")
        assert requests.post(f"{endpoint.base_url(tid)}/chat/completions", json=body, timeout=30).status_code == 401
        assert post(endpoint, tid, "chat/completions", body).json()["choices"][0]["message"]["content"] == "42"
        deadline = time.monotonic() + 10
        while refused(endpoint).get("no request", 0) < 50 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert refused(endpoint) == {"no request": 50, "not HTTP": 1, "no token": 1}
        assert all(s.recv(1) == b"" for s in silent)  # closed by the endpoint
        for s in silent:
            s.close()
    finally:
        endpoint.stop()


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "m"}, "messages"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]}, "tools"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "stream": "yes"}, "stream must be"),
        ({"model": "m", "messages": [{"role": "user", "content": "hi"}], "n": 2}, "n=1"),
    ],
    ids=["no-messages", "tool-without-function", "stream-not-bool", "n"],
)
def test_a_malformed_request_gets_openais_400_error_shape_and_records_nothing(served, body, says):
    endpoint, tid, trajectory, _ = served
    response = post(endpoint, tid, "chat/completions", body)
    error = response.json()["error"]
    assert response.status_code == 400 and set(error) == {"message", "type", "param", "code"}
    assert says in error["message"] and trajectory.turns == [] and trajectory.request_errors == 1
    assert post(endpoint, tid, "chat/completions", {"model": "m", "messages": [{"role": "user", "content": "hi"}]}).ok


def test_a_call_past_the_trajectorys_limits_is_a_400_with_the_limit_as_its_code(served):
    endpoint, tid, _, _ = served
    body = {"model": "m", "messages": [{"role": "user", "content": "hi"}]}
    codes = [post(endpoint, tid, "chat/completions", body).status_code for _ in range(5)]
    assert codes == [200, 200, 200, 200, 400]
    assert post(endpoint, tid, "chat/completions", body).json()["error"]["code"] == "max_turns"


def test_raw_completions_extend_by_tokens_and_a_new_prompt_starts_a_segment(served, tokenizer):
    endpoint, tid, trajectory, backend = served
    first = post(endpoint, tid, "completions", {"model": "m", "prompt": "6 times 7 is"}).json()
    assert first["object"] == "text_completion" and first["choices"][0]["text"] == CALL
    extended = backend.batches[-1][0] + backend.outputs[tuple(backend.batches[-1][0])] + [13]
    post(endpoint, tid, "completions", {"model": "m", "prompt": extended})
    post(endpoint, tid, "completions", {"model": "m", "prompt": ["something else"]})
    assert [t.segment for t in trajectory.turns] == [0, 0, 1] and trajectory.turns[1].prompt_delta_ids == [13]
    models = requests.get(f"{endpoint.base_url(tid)}/models", headers={"Authorization": f"Bearer {endpoint.token}"})
    assert [m["id"] for m in models.json()["data"]] == ["forge_nb-policy"]


def test_stop_closes_the_port(tokenizer):
    endpoint = Endpoint().start()
    endpoint.stop()
    with socket.socket() as probe:
        assert probe.connect_ex(("127.0.0.1", endpoint.port)) != 0


def test_the_agents_sdk_on_the_responses_api_runs_a_tool_loop_in_one_segment(served):
    """The SDK's default model kind (`OpenAIResponsesModel`): instructions, function_call and
    function_call_output items map to the chat conversation, which extends turn by turn."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    endpoint, tid, trajectory, _ = served
    tool = function_tool(multiply)
    model = OpenAIResponsesModel(model="forge_nb-policy", openai_client=endpoint.client(tid))
    agent = Agent(name="calc", instructions="Use the tool.", tools=[tool], model=model)
    result = asyncio.run(Runner.run(agent, "What is 6 times 7?", max_turns=3))
    assert result.final_output == "42"
    assert [t.segment for t in trajectory.turns] == [0, 0] and trajectory.tool_calls == 0  # the SDK ran the tool


def test_the_agents_sdk_chaining_responses_by_id_sends_only_new_items_and_the_trajectory_extends(served):
    """``auto_previous_response_id``: the SDK's second request carries the previous response's id and only the
    tool's output; the endpoint continues that response's conversation, so the turns are one segment."""
    from agents import Agent, OpenAIResponsesModel, Runner, function_tool, set_tracing_disabled

    set_tracing_disabled(True)
    endpoint, tid, trajectory, _ = served
    model = OpenAIResponsesModel(model="forge_nb-policy", openai_client=endpoint.client(tid))
    agent = Agent(name="calc", instructions="Use the tool.", tools=[function_tool(multiply)], model=model)
    result = asyncio.run(Runner.run(agent, "What is 6 times 7?", max_turns=3, auto_previous_response_id=True))
    assert result.final_output == "42" and len(result.raw_responses) == 2
    assert [t.segment for t in trajectory.turns] == [0, 0] and trajectory.request_errors == 0


def test_a_response_sent_with_store_false_is_not_kept(served):
    endpoint, tid, trajectory, _ = served
    first = post(endpoint, tid, "responses", {"model": "m", "input": "What is 6 times 7?", "store": False}).json()
    again = {"model": "m", "input": "and then?", "previous_response_id": first["id"]}
    response = post(endpoint, tid, "responses", again)
    assert response.status_code == 400 and "store=false" in response.json()["error"]["message"]
    assert len(trajectory.turns) == 1


@pytest.mark.parametrize(
    ("body", "says"),
    [
        ({"model": "m", "input": "hi", "previous_response_id": "resp_1"}, "not a response of this trajectory"),
        ({"model": "m", "input": "hi", "conversation": "conv_1"}, "conversation is not served"),
        ({"model": "m", "input": "hi", "tools": [{"type": "web_search"}]}, "'web_search' are not served"),
        ({"model": "m", "input": "hi", "tool_choice": {"type": "web_search_preview"}}, "'web_search_preview' is not"),
        ({"model": "m", "input": "hi", "tool_choice": {"type": "function", "name": "f"}}, "'f', which is not one"),
    ],
    ids=["unknown-previous-response", "conversation", "hosted-tool", "hosted-tool-choice", "unknown-function"],
)
def test_what_the_responses_route_cannot_serve_is_a_400_saying_what(served, body, says):
    endpoint, tid, trajectory, _ = served
    response = post(endpoint, tid, "responses", body)
    assert response.status_code == 400 and says in response.json()["error"]["message"] and trajectory.turns == []


def test_a_streamed_tool_loop_gets_the_unstreamed_answers_and_records_the_same_tokens(served):
    """``stream=True`` on chat: the openai client's own stream helper puts the chunks together into the same
    message, tool call and finish reason as without streaming; the usage chunk comes when asked for; the
    trajectory extends turn by turn."""
    endpoint, tid, trajectory, backend = served

    async def loop():
        client = endpoint.client(tid)
        messages = [{"role": "user", "content": "What is 6 times 7?"}]
        options = {"model": "any", "tools": [tool_schema(multiply)], "stream_options": {"include_usage": True}}
        async with client.chat.completions.stream(messages=messages, **options) as stream:
            first = await stream.get_final_completion()
        call = first.choices[0].message.tool_calls[0]
        messages += [first.choices[0].message, {"role": "tool", "tool_call_id": call.id, "content": "42"}]
        chunks = [c async for c in await client.chat.completions.create(messages=messages, stream=True, **options)]
        await client.close()
        return first, call, chunks

    first, call, chunks = asyncio.run(loop())
    assert first.choices[0].finish_reason == "tool_calls" and call.function.name == "multiply"
    assert call.function.arguments == '{"a": 6, "b": 7}' and first.usage.completion_tokens > 0
    assert chunks[0].choices[0].delta.role == "assistant" and chunks[-2].choices[0].finish_reason == "stop"
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == "42"
    usage = chunks[-1].usage  # the prompt as the backend saw it; "42" and the end of sequence
    assert chunks[-1].choices == [] and (usage.prompt_tokens, usage.completion_tokens) == (
        len(trajectory.last_prompt_ids()),
        3,
    )
    assert [t.segment for t in trajectory.turns] == [0, 0]
    assert trajectory.last_prompt_ids() == backend.batches[-1][0]


def test_streamed_raw_completions_and_responses_end_as_openais_streams_do(served):
    endpoint, tid, trajectory, _ = served
    raw = post(endpoint, tid, "completions", {"model": "m", "prompt": "6 times 7 is", "stream": True})
    lines = [line for line in raw.text.split("\n") if line]
    assert raw.headers["content-type"].startswith("text/event-stream") and lines[-1] == "data: [DONE]"
    assert json.loads(lines[0][len("data: ") :])["choices"][0]["text"] == CALL

    async def respond():
        client = endpoint.client(tid)
        async with client.responses.stream(model="m", input="What is 6 times 7?", tools=[RESPONSES_TOOL]) as stream:
            kinds = [event.type async for event in stream]
            final = await stream.get_final_response()
        await client.close()
        return kinds, final

    kinds, final = asyncio.run(respond())
    assert kinds[:2] == ["response.created", "response.in_progress"] and kinds[-1] == "response.completed"
    assert "response.function_call_arguments.delta" in kinds
    assert [item.type for item in final.output] == ["function_call"] and final.output[0].name == "multiply"
    assert len(trajectory.turns) == 2


def test_the_agents_sdk_streams_a_tool_loop_on_either_model_kind(served):
    """``Runner.run_streamed`` on the chat completions model and on the Responses model: the streamed events
    end with the answer the run without streaming gets."""
    from agents import (
        Agent,
        OpenAIChatCompletionsModel,
        OpenAIResponsesModel,
        Runner,
        function_tool,
        set_tracing_disabled,
    )

    set_tracing_disabled(True)
    endpoint, tid, trajectory, _ = served

    async def run(kind):
        model = kind(model="forge_nb-policy", openai_client=endpoint.client(tid))
        agent = Agent(name="calc", instructions="Use the tool.", tools=[function_tool(multiply)], model=model)
        result = Runner.run_streamed(agent, "What is 6 times 7?", max_turns=3)
        events = [event.type async for event in result.stream_events()]
        return result.final_output, events

    for kind, turns in ((OpenAIChatCompletionsModel, 2), (OpenAIResponsesModel, 4)):
        final, events = asyncio.run(run(kind))
        assert final == "42" and "raw_response_event" in events, kind
        assert len(trajectory.turns) == turns and trajectory.tool_calls == 0  # the SDK ran the tool


def test_an_agent_without_tools_passes_the_openai_packages_omit_through(served):
    """The Agents SDK sends ``tools=omit`` for an agent without tools (streamed or not): the rollout's
    client passes the sentinel on instead of reading it as a list of functions."""
    from agents import Agent, OpenAIChatCompletionsModel, Runner, set_tracing_disabled

    set_tracing_disabled(True)
    endpoint, tid, trajectory, _ = served

    async def run():
        model = OpenAIChatCompletionsModel(model="forge_nb-policy", openai_client=endpoint.client(tid))
        result = Runner.run_streamed(Agent(name="plain", instructions="Answer.", model=model), "6 times 7?")
        [event async for event in result.stream_events()]
        direct = await endpoint.client(tid).chat.completions.create(
            messages=[{"role": "user", "content": "6 times 7?"}], tools=openai.omit
        )
        return result.final_output, direct.choices[0].message

    final, direct = asyncio.run(run())
    assert CALL in final and direct.tool_calls is None and CALL in direct.content  # no tools: no calls parsed
    assert len(trajectory.turns) == 2


@pytest.mark.parametrize("route", ["chat/completions", "responses"])
def test_a_named_tool_choice_starts_the_reply_as_that_call_on_either_route(served, route):
    """Chat's ``{"type": "function", "function": {"name"}}`` and the Responses API's ``{"type": "function",
    "name"}``: the model is prompted with the call's opening and writes its arguments."""
    endpoint, tid, trajectory, backend = served
    backend.reply = lambda prompt: ' {"a": 6, "b": 7}}\n</tool_call>' if prompt.endswith('"arguments":') else "no"
    question = [{"role": "user", "content": "What is 6 times 7?"}]
    if route == "responses":
        body = {"model": "m", "input": question, "tools": [RESPONSES_TOOL]}
        body["tool_choice"] = {"type": "function", "name": "multiply"}
    else:
        body = {"model": "m", "messages": question, "tools": [tool_schema(multiply)]}
        body["tool_choice"] = {"type": "function", "function": {"name": "multiply"}}
    answer = post(endpoint, tid, route, body).json()
    call = answer["output"][0] if route == "responses" else answer["choices"][0]["message"]["tool_calls"][0]["function"]
    assert (call["name"], json.loads(call["arguments"])) == ("multiply", {"a": 6, "b": 7})
    assert len(trajectory.turns) == 1 and trajectory.turns[0].text.startswith('<tool_call>\n{"name": "multiply"')
