"""Env actor: runs multi-turn agent rollouts where their tools run, asking the generator for every turn.

It holds the live rollout (an agent loop ``async def rollout(client, row, **context)`` or an
environment class with ``reset`` / ``step``) and its tools, compiled from source like every piece of
live code. `rollouts` runs G trajectories per row concurrently (`agents.runner`); their model calls
go to the generator actors as batches of token ids (`agents.batching`), so a turn of every
trajectory is one generator call. Tools run here, never in the kernel. With ``agent.client="openai"``
(the default) each rollout's client is a real `openai.AsyncOpenAI` on its trajectory's URL at this
proc's OpenAI-compatible endpoint (`agents.endpoint`, on 127.0.0.1, started at the first batch, closed
with the proc), so agent frameworks that take a client or a base URL run here unchanged.
"""

from __future__ import annotations

import atexit
from dataclasses import dataclass
from typing import Any

from monarch.actor import endpoint
from transformers import AutoTokenizer

from forge_nb.actors.base import AsyncForgeActor
from forge_nb.agents.backend import generator_backend
from forge_nb.agents.client import Limits
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.runner import run_rollouts
from forge_nb.agents.trajectory import Trajectory
from forge_nb.config import Config
from forge_nb.engines.base import SamplingParams
from forge_nb.live.capture import LiveCode, compile_function


@dataclass(frozen=True)
class EnvSpec:
    """The tokenizer's directory (the chat template renders every turn), the limits of one trajectory and
    the per-call tool timeout (s)."""

    model_dir: str
    threads: int
    limits: Limits
    tool_timeout_s: float
    client: str = "openai"

    @classmethod
    def from_config(cls, config: Config) -> EnvSpec:
        a = config.agent
        limits = Limits(a.max_turns, a.max_total_tokens, config.engine.max_tokens)
        return cls(str(config.model.resolved_path()), 1, limits, a.tool_timeout_s, a.client)


@dataclass(frozen=True)
class AgentCode:
    """A live rollout: `code` (an agent loop, or an environment class when `form` is "env") and its tools."""

    code: LiveCode
    form: str  # "rollout" or "env"
    tools: tuple[LiveCode, ...] = ()


class EnvWorker(AsyncForgeActor):
    """Holds one compiled rollout and the generator replicas it asks; swaps between batches."""

    role = "env"

    def __init__(self, spec: EnvSpec) -> None:
        self._begin(spec.threads)
        self.tokenizer = AutoTokenizer.from_pretrained(spec.model_dir)
        self.limits, self.tool_timeout_s = spec.limits, spec.tool_timeout_s
        self.serve_http = spec.client == "openai"
        self.http: Endpoint | None = None
        self.generator: Any = None
        self.replicas = 1
        self.fn, self.form, self.tools, self.version = None, "rollout", [], 0
        self._ready()

    @endpoint
    async def attach_generator(self, generator: Any, replicas: int) -> None:
        """The generator actor mesh every model call goes to (again after it was replaced)."""
        self.generator, self.replicas = generator, replicas

    @endpoint
    async def set_rollout(self, agent: AgentCode, version: int) -> int:
        """Compile and make rollout `version` live for the next batch -> the version now live."""
        self.fn, self.form, self.tools, self.version = (
            compile_function(agent.code),
            agent.form,
            _compiled(agent.tools),
            version,
        )
        return self.version

    @endpoint
    async def rollouts(
        self, rows: list[dict], group_size: int, sampling: SamplingParams, context: dict, agent: AgentCode | None
    ) -> list:
        """`group_size` trajectories of each row (row-major), each with the exact token ids and logprobs of
        every model call and the policy versions that made them -> list of `Trajectory`. With `agent`, a
        candidate runs instead of the live rollout (a check: nothing changes here)."""
        if agent is not None:
            fn, form, tools, version = compile_function(agent.code), agent.form, _compiled(agent.tools), None
        elif self.fn is None:
            raise RuntimeError("no rollout is live: s.set_rollout(fn) or s.set_env(cls) first")
        else:
            fn, form, tools, version = self.fn, self.form, self.tools, self.version
        backend = generator_backend(self.generator, self.replicas)
        context = {**context, "rollout_version": version}
        trajectories: list[Trajectory] = await run_rollouts(
            backend,
            self.tokenizer,
            rows,
            group_size=group_size,
            limits=self.limits,
            sampling=sampling,
            tools=tools,
            tool_timeout=self.tool_timeout_s,
            context=context,
            endpoint=self._endpoint() if self.serve_http else None,
            **{form: fn},
        )
        for t in trajectories:
            t.info.setdefault("policy_versions", sorted(set(backend.versions)))
            if form == "env" and t.reward is None and t.finish_reason != "error":
                t.reward = 0.0  # an environment's reward is its step rewards, 0 included: the live rewards never decide
        return trajectories

    def _endpoint(self) -> Endpoint:
        """This proc's endpoint, started at the first batch; it closes with the proc."""
        if self.http is None or not self.http.running:
            self.http = Endpoint().start()
            atexit.register(self.http.stop)
        return self.http

    @endpoint
    async def endpoint_url(self) -> str | None:
        """The base URL this proc's endpoint serves on (None before the first batch)."""
        return self.http.url if self.http is not None else None


def _compiled(tools: tuple[LiveCode, ...]) -> list:
    return [compile_function(t) for t in tools]
