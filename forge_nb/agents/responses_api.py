"""The Responses API (``POST /t/<id>/v1/responses``) over the chat path: a request's `instructions` and `input`
items become chat messages, its function tools chat tool schemas; the chat completion becomes a `Response`.

What maps: `instructions` -> a system message; message items (text or text parts, any role) -> messages;
`function_call` items -> the assistant's tool calls (consecutive ones, with the assistant text before them, are
one assistant message); `function_call_output` items -> tool messages; `reasoning` items are left out (the
template renders no reasoning of earlier turns). Function tools -> chat tools; `tool_choice` ("auto", "none",
"required", ``{"type": "function", "name": f}``) -> chat's (`agents.tool_choice`). `temperature`, `top_p`,
`max_output_tokens` as in chat. `previous_response_id`: a response of the same trajectory (each is kept
while the trajectory is open, unless sent with ``store: false``) continues its conversation, its input and its
output, with this request's input after it; as OpenAI's, the earlier `instructions` are not carried over (this
request's are). Refused (400, saying which): `conversation` (the Conversations API's objects), an unknown
previous response, other item types (computer, file search, shell, MCP, ...), tool types and tool choices. The
output is a `message` item with the reply's text and one `function_call` item per tool call, as OpenAI's.
"""

from __future__ import annotations

import time
from typing import Any

from openai.types.chat import ChatCompletion
from openai.types.responses import Response, ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText
from openai.types.responses.response_usage import InputTokensDetails, OutputTokensDetails, ResponseUsage


class Unsupported(ValueError):
    """A Responses request this endpoint cannot serve (the message says which part)."""


def conversation(params: dict, stored: dict[str, list[dict]]) -> list[dict]:
    """The chat messages a validated `ResponseCreateParamsNonStreaming` continues with (its
    `instructions` aside): the stored conversation of its `previous_response_id`, then its input."""
    if params.get("conversation"):
        raise Unsupported("conversation is not served (no Conversations API): send the input, or previous_response_id")
    earlier: list[dict] = []
    previous = params.get("previous_response_id")
    if previous:
        if previous not in stored:
            raise Unsupported(
                f"previous_response_id {previous!r} is not a response of this trajectory (responses are kept while "
                "it is open, unless sent with store=false)"
            )
        earlier = stored[previous]
    items = params["input"]
    return [*earlier, *([{"role": "user", "content": items}] if isinstance(items, str) else _messages(items))]


def remember(stored: dict[str, list[dict]], params: dict, messages: list[dict], response: Response, chat) -> None:
    """Keep the conversation `response` ends (`messages` and its reply) under its id, unless ``store: false``."""
    if params.get("store") is False:
        return
    reply = chat.choices[0].message
    assistant: dict[str, Any] = {"role": "assistant", "content": reply.content}
    if reply.tool_calls:
        assistant["tool_calls"] = [call.model_dump(mode="json") for call in reply.tool_calls]
    stored[response.id] = [*messages, assistant]


def chat_arguments(params: dict, messages: list[dict]) -> dict:
    """A validated `ResponseCreateParamsNonStreaming` and its conversation -> keyword arguments of
    `AgentClient.create`."""
    system = [{"role": "system", "content": params["instructions"]}] if params.get("instructions") else []
    return {
        "messages": [*system, *messages],
        "tools": [_tool(t) for t in params.get("tools") or []] or None,
        "tool_choice": _tool_choice(params.get("tool_choice")),
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "max_tokens": params.get("max_output_tokens"),
    }


def _tool_choice(choice: Any) -> Any:
    """The Responses API's `tool_choice` in chat's form: a named function ``{"type": "function", "name": f}``
    -> ``{"type": "function", "function": {"name": f}}``; "auto", "none", "required" as they are. Others
    (allowed tools, hosted tools, MCP, custom) are refused."""
    if choice is None or isinstance(choice, str):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    kind = choice.get("type") if isinstance(choice, dict) else type(choice).__name__
    raise Unsupported(f"tool_choice of type {kind!r} is not served ('auto', 'none', 'required', a function tool)")


def response_of(chat: ChatCompletion, params: dict) -> Response:
    """The chat completion of a Responses request as a `Response` (status "incomplete" when cut at the length)."""
    choice = chat.choices[0]
    output: list[Any] = []
    if choice.message.content:
        text = ResponseOutputText(type="output_text", text=choice.message.content, annotations=[])
        output.append(
            ResponseOutputMessage(
                id=f"msg_{chat.id}", type="message", role="assistant", status="completed", content=[text]
            )
        )
    for call in choice.message.tool_calls or []:
        output.append(
            ResponseFunctionToolCall(
                type="function_call",
                id=f"fc_{call.id}",
                call_id=call.id,
                name=call.function.name,
                arguments=call.function.arguments,
                status="completed",
            )
        )
    usage = chat.usage
    incomplete = choice.finish_reason == "length"
    return Response(
        id=f"resp_{chat.id}",
        object="response",
        created_at=float(int(time.time())),
        model=chat.model,
        output=output,
        status="incomplete" if incomplete else "completed",
        incomplete_details={"reason": "max_output_tokens"} if incomplete else None,
        parallel_tool_calls=bool(params.get("parallel_tool_calls", True)),
        tool_choice=params.get("tool_choice") or "auto",
        tools=params.get("tools") or [],
        instructions=params.get("instructions"),
        temperature=params.get("temperature"),
        top_p=params.get("top_p"),
        max_output_tokens=params.get("max_output_tokens"),
        usage=ResponseUsage(
            input_tokens=usage.prompt_tokens,
            output_tokens=usage.completion_tokens,
            total_tokens=usage.total_tokens,
            input_tokens_details=InputTokensDetails(cached_tokens=0, cache_write_tokens=0),
            output_tokens_details=OutputTokensDetails(reasoning_tokens=0),
        ),
    )


def _messages(items: list[dict]) -> list[dict]:
    messages: list[dict] = []
    for i, item in enumerate(items):
        kind = item.get("type", "message")
        if kind == "message":
            messages.append({"role": item["role"], "content": _text(item.get("content"))})
        elif kind == "function_call":
            call = {
                "id": item["call_id"],
                "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            }
            if messages and messages[-1]["role"] == "assistant":
                messages[-1].setdefault("tool_calls", []).append(call)
            else:
                messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        elif kind == "function_call_output":
            output = item["output"]
            content = output if isinstance(output, str) else _text(output)
            messages.append({"role": "tool", "tool_call_id": item["call_id"], "content": content})
        elif kind != "reasoning":
            raise Unsupported(f"input.{i}: items of type {kind!r} are not served (messages and function calls are)")
    return messages


def _text(content: Any) -> str:
    """Message content: a string, or parts whose text is joined (input_text / output_text / text)."""
    if content is None or isinstance(content, str):
        return content or ""
    parts = []
    for part in content:
        if "text" not in part:
            raise Unsupported(f"content parts of type {part.get('type')!r} are not served (text parts are)")
        parts.append(part["text"])
    return "".join(parts)


def _tool(tool: dict) -> dict:
    if tool.get("type") != "function":
        raise Unsupported(f"tools of type {tool.get('type')!r} are not served (function tools are)")
    function = {"name": tool["name"], "parameters": tool.get("parameters") or {"type": "object", "properties": {}}}
    if tool.get("description"):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}
