"""Streamed answers (``"stream": true``) of the endpoint's routes, as server-sent events in OpenAI's shapes.

A trajectory records one whole completion per call, so the endpoint generates the whole completion first and then
sends it as a stream: a chat completion as `ChatCompletionChunk`s (the role, the text as one delta, each tool call as
one delta, the finish reason, then the usage when ``stream_options.include_usage``), a raw completion as one
`Completion` chunk, a response as the Responses API's events (``response.created`` ... ``response.completed``).
Each chat or completion stream ends with ``data: [DONE]``. A client that streams (``client.chat.completions.stream``,
``client.responses.stream``, the Agents SDK's ``Runner.run_streamed``, LangChain's ``streaming=True``) gets the
same text, tool calls and usage as without streaming; what it does not get is each token as it is sampled. An
error (a limit, a malformed call) is the usual JSON error, before any event.
"""

from __future__ import annotations

from collections.abc import Iterator
from itertools import count

import pydantic
from openai.types import Completion
from openai.types.chat import ChatCompletion, ChatCompletionChunk
from openai.types.chat.chat_completion_chunk import (
    Choice,
    ChoiceDelta,
    ChoiceDeltaToolCall,
    ChoiceDeltaToolCallFunction,
)
from openai.types.responses import (
    Response,
    ResponseCompletedEvent,
    ResponseContentPartAddedEvent,
    ResponseContentPartDoneEvent,
    ResponseCreatedEvent,
    ResponseFunctionCallArgumentsDeltaEvent,
    ResponseFunctionCallArgumentsDoneEvent,
    ResponseInProgressEvent,
    ResponseOutputItemAddedEvent,
    ResponseOutputItemDoneEvent,
    ResponseTextDeltaEvent,
    ResponseTextDoneEvent,
)
from starlette.responses import StreamingResponse

DONE = "data: [DONE]\n\n"


def _done_name(item) -> dict[str, str]:
    """The function's name on a `response.function_call_arguments.done` event where the installed openai's
    type has that field (openai 2.x up to at least 3.0 requires it; 3.54, the lock's, has none)."""
    return {"name": item.name} if "name" in ResponseFunctionCallArgumentsDoneEvent.model_fields else {}


def chat_chunks(completion: ChatCompletion, include_usage: bool = False) -> list[ChatCompletionChunk]:
    """A one-choice chat completion -> its chunks: the role, the content (when there is any), each tool call
    (index, id, name and whole arguments), the finish reason, and a last chunk with no choices and the usage
    (`include_usage`)."""
    choice = completion.choices[0]
    message = choice.message

    def chunk(delta: ChoiceDelta, finish: str | None = None) -> ChatCompletionChunk:
        return _chunk(completion, [Choice(index=0, delta=delta, finish_reason=finish)])

    chunks = [chunk(ChoiceDelta(role="assistant", content=""))]
    if message.content:
        chunks.append(chunk(ChoiceDelta(content=message.content)))
    for i, call in enumerate(message.tool_calls or []):
        function = ChoiceDeltaToolCallFunction(name=call.function.name, arguments=call.function.arguments)
        delta = ChoiceDeltaToolCall(index=i, id=call.id, type="function", function=function)
        chunks.append(chunk(ChoiceDelta(tool_calls=[delta])))
    chunks.append(chunk(ChoiceDelta(), choice.finish_reason))
    if include_usage:
        chunks.append(_chunk(completion, [], usage=completion.usage))
    return chunks


def _chunk(completion: ChatCompletion, choices: list[Choice], **extra) -> ChatCompletionChunk:
    return ChatCompletionChunk(
        id=completion.id,
        object="chat.completion.chunk",
        created=completion.created,
        model=completion.model,
        choices=choices,
        **extra,
    )


def completion_chunks(completion: Completion, include_usage: bool = False) -> list[Completion]:
    """A raw completion -> its chunks: the text and finish reason in one, then the usage with no choices
    (`include_usage`), as OpenAI streams ``/v1/completions``."""
    text = completion.model_copy(update={"usage": None})
    if not include_usage:
        return [text]
    return [text, completion.model_copy(update={"choices": []})]


def response_events(response: Response) -> list[pydantic.BaseModel]:
    """A completed `Response` -> the Responses API's stream of it: created, in progress, for each output item
    its added / delta / done events (a message's text part, a function call's arguments), completed. Every
    event has its ``sequence_number``, from 0."""
    number = count()
    begun = response.model_copy(update={"status": "in_progress", "output": [], "usage": None})
    events: list[pydantic.BaseModel] = [
        ResponseCreatedEvent(type="response.created", response=begun, sequence_number=next(number)),
        ResponseInProgressEvent(type="response.in_progress", response=begun, sequence_number=next(number)),
    ]
    for index, item in enumerate(response.output):
        events += _item_events(item, index, number)
    events.append(ResponseCompletedEvent(type="response.completed", response=response, sequence_number=next(number)))
    return events


def _item_events(item, index: int, number: Iterator[int]) -> list[pydantic.BaseModel]:
    """The events of output item `item` at `index`: added (empty), its parts or arguments, done."""
    where = {"item_id": item.id, "output_index": index}
    if item.type == "function_call":
        begun = item.model_copy(update={"arguments": "", "status": "in_progress"})
        body = [
            ResponseFunctionCallArgumentsDeltaEvent(
                type="response.function_call_arguments.delta", delta=item.arguments, **where, sequence_number=0
            ),
            ResponseFunctionCallArgumentsDoneEvent(
                type="response.function_call_arguments.done",
                arguments=item.arguments,
                **where,
                sequence_number=0,
                **_done_name(item),
            ),
        ]
    else:  # a message: its output_text parts
        begun = item.model_copy(update={"content": [], "status": "in_progress"})
        body = [event for i, part in enumerate(item.content) for event in _part_events(part, i, where)]
    added = ResponseOutputItemAddedEvent(
        type="response.output_item.added", item=begun, output_index=index, sequence_number=0
    )
    done = ResponseOutputItemDoneEvent(
        type="response.output_item.done", item=item, output_index=index, sequence_number=0
    )
    return [event.model_copy(update={"sequence_number": next(number)}) for event in [added, *body, done]]


def _part_events(part, part_index: int, where: dict) -> list[pydantic.BaseModel]:
    at = {**where, "content_index": part_index, "sequence_number": 0}
    return [
        ResponseContentPartAddedEvent(
            type="response.content_part.added", part=part.model_copy(update={"text": ""}), **at
        ),
        ResponseTextDeltaEvent(type="response.output_text.delta", delta=part.text, logprobs=[], **at),
        ResponseTextDoneEvent(type="response.output_text.done", text=part.text, logprobs=[], **at),
        ResponseContentPartDoneEvent(type="response.content_part.done", part=part, **at),
    ]


def sse(events: list[pydantic.BaseModel], named: bool = False) -> StreamingResponse:
    """`events` as a ``text/event-stream`` response: ``data: <json>`` each, then ``data: [DONE]`` (chat and
    completions); `named`: each with its ``event: <type>`` line and no [DONE] (the Responses API)."""
    return StreamingResponse(_lines(events, named), media_type="text/event-stream")


def _lines(events: list[pydantic.BaseModel], named: bool) -> Iterator[str]:
    for event in events:
        yield (f"event: {event.type}\n" if named else "") + f"data: {event.model_dump_json(exclude_none=True)}\n\n"
    if not named:
        yield DONE
