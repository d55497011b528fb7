import asyncio
import threading
import time

import pytest
from openai.types.chat.chat_completion_message_function_tool_call import ChatCompletionMessageFunctionToolCall

from forge_nb.agents.tools import ToolSet, UnknownToolError, tool_schema
from tests.agents.conftest import add


def explode(text: str) -> str:
    """Always fails.

    Args:
        text: Anything.
    """
    raise ValueError(f"cannot handle {text!r}")


RELEASE = threading.Event()


def hang(seconds: float) -> str:
    """Sleeps (until the test releases it).

    Args:
        seconds: How long to wait at most.
    """
    RELEASE.wait(seconds)
    return "woke up"


async def slow_async(seconds: float) -> str:
    """Sleeps asynchronously.

    Args:
        seconds: How long.
    """
    await asyncio.sleep(seconds)
    return f"slept {seconds}"


def test_schema_comes_from_the_signature_and_the_google_docstring():
    schema = tool_schema(add)
    assert schema["type"] == "function"
    fn = schema["function"]
    assert fn["name"] == "add" and fn["description"] == "Add two integers."
    assert fn["parameters"]["properties"]["a"] == {"type": "integer", "description": "The first number."}
    assert fn["parameters"]["required"] == ["a", "b"]


def test_a_call_by_name_runs_the_tool_and_its_value_becomes_text():
    tools = ToolSet([add])
    result = asyncio.run(tools.call("add", '{"a": 2, "b": 40}', "call_0"))
    assert (result.content, result.error, result.call_id) == ("42", False, "call_0")
    assert (tools.calls, tools.errors) == (1, 0)


def test_raising_unknown_bad_json_and_bad_arguments_give_counted_error_observations():
    seen = []
    tools = ToolSet([add, explode], on_result=seen.append)

    def call(name, arguments):  # as the model writes them
        return {"id": "c", "function": {"name": name, "arguments": arguments}}

    messages = asyncio.run(
        tools.run(
            [
                call("explode", {"text": "x"}),
                call("divide", {"a": 1}),
                call("add", '{"a": 1, "b": '),
                call("add", {"a": 1, "c": 2}),
                call("", "{"),
            ]
        )
    )
    contents = [m["content"] for m in messages]
    assert sorted(contents) == sorted(r.content for r in seen) and all(r.error for r in seen) and len(seen) == 5
    assert contents[0] == "Error: tool explode raised ValueError: cannot handle 'x'"
    assert "unknown tool 'divide'" in contents[1] and "['add', 'explode']" in contents[1]
    assert "not valid JSON" in contents[2]
    assert "bad arguments for add" in contents[3]
    assert "no name" in contents[4]
    assert (tools.calls, tools.errors) == (5, 5)


def test_a_hanging_sync_tool_times_out_and_the_loop_goes_on():
    tools = ToolSet([hang, add], timeout=0.2)

    async def calls():
        start = time.perf_counter()
        hung, ok = await asyncio.gather(tools.call("hang", {"seconds": 30}), tools.call("add", {"a": 1, "b": 1}))
        return hung, ok, time.perf_counter() - start

    try:
        hung, ok, seconds = asyncio.run(calls())
    finally:
        RELEASE.set()  # the abandoned thread returns now instead of in 30 s
    assert hung.error and hung.content == "Error: tool hang timed out after 0.2 s."
    assert ok.content == "2" and seconds < 2


def test_async_tools_are_awaited_with_the_timeout():
    tools = ToolSet([slow_async], timeout=0.3)
    ok = asyncio.run(tools.call("slow_async", {"seconds": 0.01}))
    late = asyncio.run(tools.call("slow_async", {"seconds": 5}))
    assert ok.content == "slept 0.01" and not ok.error
    assert late.error and "timed out after 0.3 s" in late.content


def test_run_takes_openai_tool_call_objects_and_returns_tool_messages_in_order():
    calls = [
        ChatCompletionMessageFunctionToolCall(
            id=f"call_{i}", type="function", function={"name": "add", "arguments": f'{{"a": {i}, "b": 1}}'}
        )
        for i in range(3)
    ]
    messages = asyncio.run(ToolSet([add]).run(calls))
    expected = [{"role": "tool", "tool_call_id": f"call_{i}", "name": "add", "content": str(i + 1)} for i in range(3)]
    assert messages == expected


def test_the_rollouts_own_call_of_an_unknown_tool_raises():
    tools = ToolSet([add])
    with pytest.raises(UnknownToolError, match=r"no tool 'search'; the tools are \['add'\]"):
        asyncio.run(tools.call("search", {"q": "x"}))
    assert tools.calls == 0
