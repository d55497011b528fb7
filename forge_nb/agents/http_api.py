"""The OpenAI-compatible routes of `agents.endpoint` (Starlette, served by uvicorn).

    POST /t/<trajectory id>/v1/chat/completions   messages, tools, tool_choice, temperature, top_p,
                                                  max_tokens / max_completion_tokens, stop
    POST /t/<trajectory id>/v1/completions        prompt (text or token ids)
    POST /t/<trajectory id>/v1/responses          the Responses API over the chat path (`agents.responses_api`)
    GET  /t/<trajectory id>/v1/models, /v1/models the policy, as one model

Requests are validated against the `openai` package's own parameter types
(`CompletionCreateParamsNonStreaming`); responses are its `ChatCompletion` / `Completion` models,
dumped as JSON. A request without the endpoint's token gets 401, a closed or unknown trajectory 404,
a malformed body 400, a call past a trajectory's limits 400 with ``code`` "max_turns" or "max_tokens":
each in OpenAI's error shape ``{"error": {"message", "type", "param", "code"}}``, which the `openai`
client raises as `AuthenticationError`, `NotFoundError`, `BadRequestError`. ``"stream": true`` is served as
OpenAI's server-sent events of the whole completion (`agents.streaming`); ``n > 1`` is refused (400): the
trajectory records one completion per call.
"""

from __future__ import annotations

import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterator
from typing import Any

import pydantic
from openai.types import Model
from openai.types import completion_create_params as completion_params
from openai.types.chat import completion_create_params as chat_params
from openai.types.responses import response_create_params as response_params
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from forge_nb.agents import responses_api, streaming
from forge_nb.agents.client import ConversationError, RolloutLimit
from forge_nb.runtime.refusals import REFUSED

Endpoint = Any  # `agents.endpoint.Endpoint` (not imported: it imports this module to serve)

MODEL = "forge_nb-policy"
CHAT = pydantic.TypeAdapter(chat_params.CompletionCreateParamsNonStreaming)
COMPLETION = pydantic.TypeAdapter(completion_params.CompletionCreateParamsNonStreaming)
RESPONSE = pydantic.TypeAdapter(response_params.ResponseCreateParamsNonStreaming)
Handler = Callable[[Request], Awaitable[Response]]


class ApiError(Exception):
    """An OpenAI-shaped error response."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error", code: str | None = None) -> None:
        super().__init__(message)
        self.status, self.kind, self.code = status, kind, code

    def response(self) -> JSONResponse:
        error = {"message": str(self), "type": self.kind, "param": None, "code": self.code}
        return JSONResponse({"error": error}, status_code=self.status)


def make_app(endpoint: Endpoint) -> Starlette:
    """The Starlette app serving `endpoint`'s trajectories."""

    def guarded(handler: Callable[[Request, Endpoint], Awaitable[Response]]) -> Handler:
        async def serve(request: Request) -> Response:
            endpoint.requests += 1
            try:
                _authorize(request, endpoint.token)
                return await handler(request, endpoint)
            except ApiError as e:
                if e.status == 401:
                    client = request.client
                    REFUSED.refused(endpoint.name, "no token", f"{client.host}:{client.port}" if client else "")
                return e.response()
            except Exception as e:  # noqa: BLE001 - a bug here answers in OpenAI's shape, the server goes on
                return ApiError(500, f"forge_nb endpoint: {type(e).__name__}: {e}", "server_error").response()

        return serve

    return Starlette(
        routes=[
            Route("/t/{tid}/v1/chat/completions", guarded(chat_completions), methods=["POST"]),
            Route("/t/{tid}/v1/completions", guarded(completions), methods=["POST"]),
            Route("/t/{tid}/v1/responses", guarded(responses), methods=["POST"]),
            Route("/t/{tid}/v1/models", guarded(models), methods=["GET"]),
            Route("/v1/models", guarded(models), methods=["GET"]),
        ]
    )


async def chat_completions(request: Request, endpoint: Endpoint) -> Response:
    opened = _opened(request, endpoint)
    params = await _params(request, CHAT, opened)
    call = opened.client.create(
        messages=params["messages"],
        tools=params.get("tools"),
        tool_choice=params.get("tool_choice"),
        max_tokens=params.get("max_tokens") or params.get("max_completion_tokens"),
        **_sampling(params),
    )
    result = await _run(endpoint, opened, call)
    if params.get("stream"):
        return streaming.sse(streaming.chat_chunks(result, _include_usage(params)))
    return _json(result)


async def completions(request: Request, endpoint: Endpoint) -> Response:
    opened = _opened(request, endpoint)
    params = await _params(request, COMPLETION, opened)
    prompt = params["prompt"]
    if isinstance(prompt, list) and prompt and not isinstance(prompt[0], int):
        if len(prompt) != 1:
            opened.client.trajectory.request_errors += 1
            raise ApiError(400, "one prompt per call: a trajectory records one completion at a time")
        prompt = prompt[0]
    call = opened.client.complete(prompt, max_tokens=params.get("max_tokens"), **_sampling(params))
    result = await _run(endpoint, opened, call)
    if params.get("stream"):
        return streaming.sse(streaming.completion_chunks(result, _include_usage(params)))
    return _json(result)


async def responses(request: Request, endpoint: Endpoint) -> Response:
    opened = _opened(request, endpoint)
    params = await _params(request, RESPONSE, opened)
    try:
        messages = responses_api.conversation(params, opened.responses)
        arguments = responses_api.chat_arguments(params, messages)
    except responses_api.Unsupported as e:
        opened.client.trajectory.request_errors += 1
        raise ApiError(400, str(e)) from None
    chat = await _run(endpoint, opened, opened.client.create(**arguments))
    response = responses_api.response_of(chat, params)
    responses_api.remember(opened.responses, params, messages, response, chat)
    if params.get("stream"):
        return streaming.sse(streaming.response_events(response), named=True)
    return _json(response)


async def models(request: Request, endpoint: Endpoint) -> JSONResponse:
    if "tid" in request.path_params:
        _opened(request, endpoint)
    model = Model(id=MODEL, created=int(time.time()), object="model", owned_by="forge_nb")
    return JSONResponse({"object": "list", "data": [model.model_dump(mode="json")]})


def _json(result: pydantic.BaseModel) -> JSONResponse:
    return JSONResponse(result.model_dump(mode="json", exclude_none=True))


def _include_usage(params: dict) -> bool:
    return bool((params.get("stream_options") or {}).get("include_usage"))


async def _run(endpoint: Endpoint, opened, call) -> Any:
    """Run the call on its trajectory's loop -> its result, or an OpenAI-shaped error."""
    try:
        return await endpoint.run(opened, call)
    except RolloutLimit as e:
        raise ApiError(400, f"this trajectory reached its limit: {e}", code=e.reason) from None
    except (ConversationError, ValueError, TypeError) as e:
        opened.client.trajectory.request_errors += 1
        raise ApiError(400, f"{type(e).__name__}: {e}") from None


def _sampling(params: dict) -> dict:
    """The sampling parameters chat and raw completions share."""
    return {
        "temperature": params.get("temperature"),
        "top_p": params.get("top_p"),
        "stop": params.get("stop"),
        "n": params.get("n") or 1,
    }


def _authorize(request: Request, token: str) -> None:
    header = request.headers.get("authorization", "")
    if not secrets.compare_digest(header.encode(), f"Bearer {token}".encode()):  # in constant time
        what = "no API key" if not header else "a wrong API key"
        raise ApiError(401, f"forge_nb endpoint: {what}; pass the session's token as api_key", "authentication_error")


def _opened(request: Request, endpoint: Endpoint):
    try:
        return endpoint.get(request.path_params["tid"])
    except LookupError as e:  # `agents.endpoint.TrajectoryClosed`
        raise ApiError(404, str(e), code="trajectory_not_found") from None


async def _params(request: Request, adapter: pydantic.TypeAdapter, opened) -> dict:
    """The JSON body validated against an `openai` params type (lazy iterables read out) -> a dict. A body
    that is not counts as a request error of the trajectory."""
    try:
        return await _validated(request, adapter)
    except ApiError:
        opened.client.trajectory.request_errors += 1
        raise


async def _validated(request: Request, adapter: pydantic.TypeAdapter) -> dict:
    try:
        body = json.loads(await request.body())
    except ValueError as e:
        raise ApiError(400, f"the body is not JSON: {e}") from None
    if not isinstance(body, dict):
        raise ApiError(400, "the body must be a JSON object")
    stream = body.pop("stream", None)  # validated as the non-streaming params; answered as a stream
    if stream not in (None, True, False):
        raise ApiError(400, f"malformed request: stream must be true or false, not {stream!r}")
    try:
        params = _materialized(adapter.validate_python(body), "")
    except pydantic.ValidationError as e:
        raise ApiError(400, f"malformed request: {_first_error(e)}") from None
    return {**params, "stream": bool(stream)}


def _materialized(value: Any, path: str) -> Any:
    """Validated params with pydantic's lazy `Iterable` validators run to lists (a bad item raises
    `ApiError` naming where it is: pydantic's own location of a lazy item lacks the field's name)."""
    if isinstance(value, dict):
        return {k: _materialized(v, f"{path}{k}.") for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_materialized(v, f"{path}{i}.") for i, v in enumerate(value)]
    if _is_lazy(value):
        try:
            items = list(value)
        except pydantic.ValidationError as e:
            raise ApiError(400, f"malformed request: {path}{_first_error(e)}") from None
        return [_materialized(v, f"{path}{i}.") for i, v in enumerate(items)]
    return value


def _is_lazy(value: Any) -> bool:
    return isinstance(value, Iterator) or type(value).__name__ == "ValidatorIterator"


def _first_error(error: pydantic.ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"])
    return f"{where}: {first['msg']}" + (f" ({error.error_count() - 1} more)" if error.error_count() > 1 else "")
