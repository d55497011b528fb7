"""The REST routes of the Tinker API (Starlette, served by uvicorn in a thread: `endpoint`), under /api/v1.

Every request carries the session's key as ``X-API-Key`` (what the SDK sends from ``TINKER_API_KEY``), else 401,
counted as a refusal (`runtime.refusals`: the session's "security" events).
Errors have Tinker's shape, ``{"detail": message}`` (what its FastAPI server sends; the SDK puts it in its
exception's message): 400 for a bad request, naming the field; 404 for an unknown id, or for a route this server
does not serve (the message names it). A request that was queued and then failed answers its future with
Tinker's ``{"error", "category"}`` instead (`futures.Failed`).

`retrieve_future` waits for the result up to `futures.POLL_S` (a long poll under the SDK's 45 s timeout), then
answers 408 with a try-again body, which the SDK polls again at once without a warning. forward_backward and sample
results are protobuf (``application/x-protobuf``), the SDK's only way of reading them; the others JSON.
"""

from __future__ import annotations

import json
import secrets
import traceback
from collections.abc import Awaitable, Callable
from typing import Any

import pydantic
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from forge_nb.runtime.refusals import REFUSED
from forge_nb.server.tinker.checkpoints import NotFound
from forge_nb.server.tinker.futures import Failed
from forge_nb.server.tinker.service import CLIENT_CONFIG, TinkerService
from forge_nb.server.tinker.wire import BadRequest

PROTOBUF = "application/x-protobuf"
Handler = Callable[[Request], Awaitable[Response]]


def make_app(service: TinkerService, api_key: str, listener: Callable[[], str] = lambda: "Tinker API") -> Starlette:
    """The routes of `service`, behind `api_key`; a request without it is a refusal of `listener()`'s."""

    def guarded(handler: Callable[[Request], Awaitable[Any]]) -> Handler:
        async def serve(request: Request) -> Response:
            given = request.headers.get("x-api-key", "")
            if not secrets.compare_digest(given.encode(), api_key.encode()):  # in constant time
                what = "no API key" if not given else "a wrong API key"
                client = request.client
                REFUSED.refused(listener(), what, f"{client.host}:{client.port}" if client else "")
                return _error(401, f"forge_nb Tinker API: {what}; set TINKER_API_KEY to the key the session gave")
            try:
                answer = await handler(request)
            except BadRequest as e:
                return _error(400, str(e))
            except NotFound as e:
                return _error(404, str(e))
            except pydantic.ValidationError as e:
                return _error(400, _first_error(e))
            except Exception as e:  # noqa: BLE001 - a bug answers in Tinker's shape; the session goes on
                traceback.print_exc()
                answer = _error(500, f"forge_nb Tinker API: {type(e).__name__}: {e}")
                answer.headers["x-should-retry"] = "false"  # the same request would fail the same way
                return answer
            return answer if isinstance(answer, Response) else JSONResponse(answer)

        return serve

    def body(call: Callable[[dict], Any]) -> Callable[[Request], Awaitable[Any]]:
        async def handle(request: Request) -> Any:
            return call(await _json(request))

        return handle

    async def forward_backward(request: Request) -> Any:
        raw = await request.body()
        if request.headers.get("content-encoding", "") == "zstd":
            import zstandard

            raw = zstandard.ZstdDecompressor().decompress(raw)
        return service.forward_backward(raw)

    async def retrieve_future(request: Request) -> Response:
        payload = await _json(request)
        request_id = payload.get("request_id")
        if not isinstance(request_id, str):
            raise BadRequest("request_id: a string")
        if not service.futures.known(request_id):
            raise NotFound(f"request_id: no request {request_id!r} in this forge_nb session (or its result went)")
        result = await service.futures.wait(request_id)
        if result is None:
            return JSONResponse({"type": "try_again", "request_id": request_id, "queue_state": "active"}, 408)
        if isinstance(result, bytes):
            return Response(result, media_type=PROTOBUF)
        if isinstance(result, Failed):
            return JSONResponse(result.body())
        return JSONResponse(result)

    def fixed(value: dict) -> Callable[[Request], Awaitable[dict]]:
        async def handle(request: Request) -> dict:
            return value

        return handle

    def path(call: Callable[..., Any], *names: str) -> Callable[[Request], Awaitable[Any]]:
        async def handle(request: Request) -> Any:
            return call(*(request.path_params[n] for n in names))

        return handle

    async def unserved(request: Request) -> Response:
        return _error(
            404,
            f"forge_nb's Tinker API does not serve {request.method} {request.url.path} (it serves training, sampling, "
            "weights and checkpoints of the session's model: see forge_nb's 'Coming from Tinker' guide)",
        )

    v1 = "/api/v1"
    routes = [
        Route(f"{v1}/client/config", guarded(fixed(CLIENT_CONFIG)), methods=["POST"]),
        Route(f"{v1}/client/dynamic_config", guarded(fixed({"refresh_interval_sec": 300})), methods=["POST"]),
        Route(f"{v1}/create_session", guarded(body(service.create_session)), methods=["POST"]),
        Route(f"{v1}/session_heartbeat", guarded(body(service.heartbeat)), methods=["POST"]),
        Route(f"{v1}/sessions/{{sid}}/finish", guarded(path(service.finish, "sid")), methods=["POST"]),
        Route(f"{v1}/telemetry", guarded(fixed({"status": "accepted"})), methods=["POST"]),
        Route(f"{v1}/healthz", guarded(fixed({"status": "ok"})), methods=["GET"]),
        Route(f"{v1}/get_server_capabilities", guarded(path(service.capabilities)), methods=["GET"]),
        Route(f"{v1}/create_model", guarded(body(service.create_model)), methods=["POST"]),
        Route(f"{v1}/get_info", guarded(body(service.get_info)), methods=["POST"]),
        Route(f"{v1}/forward_backward", guarded(forward_backward), methods=["POST"]),
        Route(f"{v1}/optim_step", guarded(body(service.optim_step)), methods=["POST"]),
        Route(f"{v1}/save_weights", guarded(body(service.save_weights)), methods=["POST"]),
        Route(f"{v1}/save_weights_for_sampler", guarded(body(service.save_weights_for_sampler)), methods=["POST"]),
        Route(f"{v1}/load_weights", guarded(body(service.load_weights)), methods=["POST"]),
        Route(f"{v1}/create_sampling_session", guarded(body(service.create_sampling_session)), methods=["POST"]),
        Route(f"{v1}/samplers/{{sid}}", guarded(path(service.get_sampler, "sid")), methods=["GET"]),
        Route(f"{v1}/asample", guarded(body(service.asample)), methods=["POST"]),
        Route(f"{v1}/retrieve_future", guarded(retrieve_future), methods=["POST"]),
        Route(f"{v1}/weights_info", guarded(body(service.weights_info)), methods=["POST"]),
        Route(f"{v1}/checkpoints", guarded(path(service.list_checkpoints)), methods=["GET"]),
        Route(f"{v1}/training_runs", guarded(path(service.training_runs)), methods=["GET"]),
        Route(f"{v1}/training_runs/{{rid}}", guarded(path(service.training_run, "rid")), methods=["GET"]),
        Route(
            f"{v1}/training_runs/{{rid}}/checkpoints", guarded(path(service.list_checkpoints, "rid")), methods=["GET"]
        ),
        Route(
            f"{v1}/training_runs/{{rid}}/checkpoints/{{cid:path}}",
            guarded(path(service.delete_checkpoint, "rid", "cid")),
            methods=["DELETE"],
        ),
        Route("/{rest:path}", guarded(unserved), methods=["GET", "POST", "PUT", "PATCH", "DELETE"]),
    ]
    return Starlette(routes=routes)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"detail": message}, status_code=status)


async def _json(request: Request) -> dict:
    try:
        value = json.loads(await request.body() or b"{}")
    except ValueError as e:
        raise BadRequest(f"the body is not JSON: {e}") from None
    if not isinstance(value, dict):
        raise BadRequest("the body must be a JSON object")
    return value


def _first_error(error: pydantic.ValidationError) -> str:
    first = error.errors()[0]
    where = ".".join(str(p) for p in first["loc"]) or "body"
    more = f" ({error.error_count() - 1} more)" if error.error_count() > 1 else ""
    return f"{where}: {first['msg']}{more}"
