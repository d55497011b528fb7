"""The client a rollout gets: a real `openai.AsyncOpenAI` bound to its trajectory's URL on the endpoint.

Frameworks take it as is (``OpenAIChatCompletionsModel(model=..., openai_client=client)``) or take its
`base_url` and `api_key`. Two conveniences over the plain client, so rollouts written for forge_nb's
in-process client run unchanged: `model` may be left out (the endpoint serves one policy), and `tools`
may be a `ToolSet` or plain functions (their JSON schemas are sent). `trajectory` is the trajectory the
endpoint records into (for ``trajectory.add_reward``; the same object as ``context["trajectory"]``).
"""

from __future__ import annotations

from functools import cached_property
from typing import Any

import httpx
from openai import AsyncOpenAI
from openai.resources.chat import AsyncChat
from openai.resources.chat.completions import AsyncCompletions

from forge_nb.agents.client import tool_schemas
from forge_nb.agents.tools import ToolSet
from forge_nb.agents.trajectory import Trajectory

MODEL = "forge_nb-policy"
# Generation on a busy CPU mesh can take minutes per batch; retries would duplicate turns.
TIMEOUT = httpx.Timeout(600.0, connect=10.0)


class _Completions(AsyncCompletions):
    async def create(self, *, messages: Any, model: str = MODEL, tools: Any = None, **kwargs: Any) -> Any:
        if isinstance(tools, ToolSet | list | tuple):  # functions become their schemas; schemas stay as they are
            kwargs["tools"] = tool_schemas(tools)
        elif tools is not None:  # the openai package's `omit` / `NOT_GIVEN` (the Agents SDK's "no tools")
            kwargs["tools"] = tools
        return await super().create(messages=messages, model=model, **kwargs)


class _Chat(AsyncChat):
    @cached_property
    def completions(self) -> _Completions:
        return _Completions(self._client)


class TrajectoryClient(AsyncOpenAI):
    """`openai.AsyncOpenAI(base_url=<trajectory URL>, api_key=<endpoint token>)`, plus `trajectory`."""

    def __init__(self, base_url: str, api_key: str, trajectory: Trajectory, **kwargs: Any) -> None:
        kwargs.setdefault("timeout", TIMEOUT)
        kwargs.setdefault("max_retries", 0)
        super().__init__(base_url=base_url, api_key=api_key, **kwargs)
        self.trajectory = trajectory

    @cached_property
    def chat(self) -> _Chat:  # type: ignore[override]
        return _Chat(self)
