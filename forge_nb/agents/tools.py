"""Tools: plain Python functions the model can call, run with a timeout, never raising into the loop.

A tool is a function with type hints and a Google-style docstring (``Args:`` section); its JSON schema
comes from `transformers.utils.get_json_schema`, as transformers' own chat templates expect it
(``{"type": "function", "function": {"name", "description", "parameters"}}``). A call by name with
arguments (a dict, or the JSON string an OpenAI-shaped tool call carries) gives a `ToolResult` whose
`content` is what the model sees next: the tool's return value as text, or an error message when the
tool is unknown, its arguments are not JSON or do not fit its signature, it raised, or it ran past the
timeout. Errors are counted, never raised.

Sync tools run in a fresh daemon thread each call: a tool that hangs past the timeout is abandoned
(Python cannot kill a thread), it keeps running in the background until it returns, and the process
can still exit. Async tools are awaited with the same timeout; an async tool that blocks the event
loop (``time.sleep`` instead of ``await asyncio.sleep``) cannot be interrupted.
"""

from __future__ import annotations

import asyncio
import inspect
import json
import threading
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

DEFAULT_TIMEOUT_S = 10.0
MAX_CONTENT_CHARS = 4000  # a tool result longer than this is cut (the model's context is small)


@dataclass
class ToolResult:
    """One tool call's outcome: `content` is the observation the model gets (an error message when
    `error`); `seconds` is the wall time it took."""

    call_id: str
    name: str
    content: str
    error: bool
    seconds: float

    def message(self) -> dict:
        """The ``{"role": "tool", ...}`` chat message carrying this result."""
        return {"role": "tool", "tool_call_id": self.call_id, "name": self.name, "content": self.content}


def tool_schema(fn: Callable) -> dict:
    """JSON schema of `fn` from its signature and Google-style docstring (raises if they are incomplete:
    every argument needs a type hint and an ``Args:`` line)."""
    return get_json_schema(fn)


class UnknownToolError(KeyError):
    """A rollout's own code called a tool that is not in its tool set."""

    def __str__(self) -> str:
        return str(self.args[0])


class ToolSet:
    """The tools of one rollout: their schemas, and running calls to them by name.

    `calls` and `errors` count every call run through this set; `on_result` (if given) sees each
    `ToolResult` (the runner uses it to count tool calls per turn of a trajectory).
    """

    def __init__(
        self,
        tools: Iterable[Callable] = (),
        timeout: float = DEFAULT_TIMEOUT_S,
        on_result: Callable[[ToolResult], None] | None = None,
    ) -> None:
        self.functions: dict[str, Callable] = {fn.__name__: fn for fn in tools}
        self.schemas: list[dict] = [tool_schema(fn) for fn in self.functions.values()]
        self.timeout = timeout
        self.on_result = on_result
        self.calls = 0
        self.errors = 0

    def bound(self, on_result: Callable[[ToolResult], None]) -> ToolSet:
        """The same tools and timeout with fresh counters, reporting to `on_result`."""
        return ToolSet(self.functions.values(), self.timeout, on_result)

    async def call(self, name: str, arguments: dict | str | None, call_id: str = "") -> ToolResult:
        """Run tool `name` with `arguments` for the rollout's own code -> its result. A tool that raises,
        hangs or gets bad arguments gives an error result (counted); a `name` not in the set is the
        code's bug, not the model's, and raises `UnknownToolError` (the rollout is refused at validation)."""
        if name not in self.functions:
            raise UnknownToolError(f"tools.call: no tool {name!r}; the tools are {sorted(self.functions)}")
        return await self._call(name, arguments, call_id)

    async def _call(self, name: str, arguments: dict | str | None, call_id: str = "") -> ToolResult:
        """Run tool `name` with `arguments` -> its result (never raises; errors become the content)."""
        start = time.perf_counter()
        content, error = await self._run(name, arguments)
        if len(content) > MAX_CONTENT_CHARS:
            content = content[:MAX_CONTENT_CHARS] + f"... [cut at {MAX_CONTENT_CHARS} characters]"
        result = ToolResult(call_id, name, content, error, time.perf_counter() - start)
        self.calls += 1
        self.errors += int(error)
        if self.on_result is not None:
            self.on_result(result)
        return result

    async def run(self, tool_calls: Sequence[Any] | None) -> list[dict]:
        """Run the model's OpenAI-shaped tool calls (dicts or `openai` objects, as `message.tool_calls`
        holds them) concurrently -> their ``{"role": "tool"}`` messages, in order. Every failure, an unknown
        tool's name included, is an error message the model reads next (counted)."""
        calls = [_as_dict(c) for c in tool_calls or ()]
        results = await asyncio.gather(
            *(self._call(c["function"].get("name", ""), c["function"].get("arguments"), c.get("id", "")) for c in calls)
        )
        return [r.message() for r in results]

    async def _run(self, name: str, arguments: dict | str | None) -> tuple[str, bool]:
        fn = self.functions.get(name)
        if fn is None:
            if not name:
                return "Error: the tool call has no name; write a JSON object with a 'name' and 'arguments'.", True
            return f"Error: unknown tool {name!r}; the tools are {sorted(self.functions)}.", True
        if isinstance(arguments, str):
            try:
                arguments = json.loads(arguments) if arguments.strip() else {}
            except json.JSONDecodeError as e:
                return f"Error: the arguments of {name} are not valid JSON ({e}).", True
        arguments = arguments or {}
        if not isinstance(arguments, dict):
            return f"Error: the arguments of {name} must be a JSON object, got {type(arguments).__name__}.", True
        try:
            inspect.signature(fn).bind(**arguments)
        except TypeError as e:
            return f"Error: bad arguments for {name}: {e}.", True
        try:
            if inspect.iscoroutinefunction(fn):
                value = await asyncio.wait_for(fn(**arguments), self.timeout)
            else:
                value = await _in_thread(fn, arguments, self.timeout)
        except TimeoutError:
            return f"Error: tool {name} timed out after {self.timeout:g} s.", True
        except Exception as e:  # noqa: BLE001 - any tool failure is the model's observation
            return f"Error: tool {name} raised {type(e).__name__}: {e}", True
        return (value if isinstance(value, str) else json.dumps(value, default=str)), False


async def _in_thread(fn: Callable, arguments: dict, timeout: float) -> Any:
    """`fn(**arguments)` in a new daemon thread; raises TimeoutError after `timeout` s (the thread is
    abandoned, see the module docstring) and re-raises what `fn` raised."""
    loop = asyncio.get_running_loop()
    done: asyncio.Future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if done.done():
            return
        if exc is None:
            done.set_result(value)
        else:
            done.set_exception(exc)

    def target() -> None:
        try:
            value, exc = fn(**arguments), None
        except BaseException as e:  # noqa: BLE001 - handed back to the awaiting task
            value, exc = None, e
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the loop closed while an abandoned tool was still running
            pass

    threading.Thread(target=target, name=f"tool-{fn.__name__}", daemon=True).start()
    return await asyncio.wait_for(done, timeout)


def _as_dict(call: Any) -> dict:
    """An OpenAI tool call (dict or pydantic object) -> a plain dict."""
    return call.model_dump() if hasattr(call, "model_dump") else dict(call)
