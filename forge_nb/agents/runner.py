"""Running many multi-turn rollouts at once: G trajectories per row, their turns batched together.

Two ways to write a rollout, both plain live code:

- an agent loop ``async def rollout(client, row, **context)``: `client` is an `AgentClient` (OpenAI
  chat API); `context` holds the caller's context plus ``trajectory`` (to add per-turn rewards with
  ``trajectory.add_reward(x)``), ``tools`` (a `ToolSet` of the runner's tools, counting calls on the
  trajectory), ``group`` and ``sample``. It returns a float reward, a dict with "reward" (the rest goes
  to `Trajectory.info`), or None (no reward of its own: the live rewards score the trajectory);
- an environment: ``env()`` makes a fresh one per trajectory, with ``reset(row) -> observation`` and
  ``step(action) -> (observation, reward, done)`` (a gymnasium-style 5-tuple ``(obs, reward,
  terminated, truncated, info)`` works too); an observation is a string (a user message) or a list of
  chat messages; either method may be async. The runner sends the observation, passes the model's reply
  text as the action, records each step's reward on its turn, and stops when `done`.

Finish reasons: "stop" (the rollout returned / the environment said done), "max_turns", "max_tokens"
(the trajectory's token budget ran out, even if the rollout then returned), "error" (the rollout or
the environment raised; `Trajectory.error` says what). A limit raised inside a rollout ends it, so its
return value is lost: its reward is None and the live rewards decide.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, Protocol

from forge_nb.agents.batching import Backend, GenerationBatcher, is_async
from forge_nb.agents.client import AgentClient, Limits, RolloutLimit
from forge_nb.agents.endpoint import Endpoint
from forge_nb.agents.tools import DEFAULT_TIMEOUT_S, ToolSet
from forge_nb.agents.trajectory import Trajectory
from forge_nb.engines.base import SamplingParams

RolloutFn = Callable[..., Awaitable[float | dict | None]]
Observation = str | list[dict]


class Environment(Protocol):
    """A text environment driven by the runner (OpenEnv / gymnasium-like)."""

    def reset(self, row: dict) -> Observation: ...

    def step(self, action: str) -> tuple[Observation, float, bool]: ...


async def run_rollouts(
    backend: Backend | GenerationBatcher,
    tokenizer,
    rows: Sequence[dict],
    rollout: RolloutFn | None = None,
    env: Callable[[], Environment] | None = None,
    group_size: int = 1,
    limits: Limits | None = None,
    sampling: SamplingParams | None = None,
    tools: Sequence[Callable] = (),
    tool_timeout: float = DEFAULT_TIMEOUT_S,
    context: dict | None = None,
    endpoint: Endpoint | None = None,
) -> list[Trajectory]:
    """`len(rows) * group_size` trajectories, row-major (index i * G + j is sample j of row i), run
    concurrently; exactly one of `rollout` (agent loop) and `env` (environment factory) is given.
    `limits` default to `Limits()`; `sampling` gives the calls' defaults (see `AgentClient`). With a
    started `endpoint`, each rollout's client is a real `openai.AsyncOpenAI` on its trajectory's URL
    there (`agents.endpoint`); without, the in-process `AgentClient`."""
    if (rollout is None) == (env is None):
        raise ValueError("run_rollouts: give either rollout= (an agent loop) or env= (an environment factory)")
    if rollout is not None and not is_async(rollout):
        raise TypeError(
            f"rollout {getattr(rollout, '__name__', rollout)!r} must be `async def rollout(client, row, **context)`"
        )
    batcher = backend if isinstance(backend, GenerationBatcher) else GenerationBatcher(backend)
    toolset = ToolSet(tools, tool_timeout)
    jobs = [
        _run_one(batcher, tokenizer, row, i, j, rollout, env, limits, sampling, toolset, dict(context or {}), endpoint)
        for i, row in enumerate(rows)
        for j in range(group_size)
    ]
    return list(await asyncio.gather(*jobs))


async def _run_one(
    batcher: GenerationBatcher,
    tokenizer,
    row: dict,
    group: int,
    sample: int,
    rollout: RolloutFn | None,
    env: Callable[[], Environment] | None,
    limits: Limits | None,
    sampling: SamplingParams | None,
    toolset: ToolSet,
    context: dict,
    endpoint: Endpoint | None,
) -> Trajectory:
    trajectory = Trajectory(row=row, group=group, sample=sample)
    conversation = AgentClient(batcher, tokenizer, trajectory, limits, sampling)
    async with _client(conversation, endpoint) as client:
        await _drive(client, conversation, trajectory, row, rollout, env, toolset, context)
    return trajectory


@asynccontextmanager
async def _client(conversation: AgentClient, endpoint: Endpoint | None) -> AsyncIterator[Any]:
    """The rollout's client: `conversation` itself, or an `openai.AsyncOpenAI` on its URL at `endpoint`."""
    if endpoint is None:
        yield conversation
        return
    tid = endpoint.open(conversation)
    client = endpoint.client(tid)
    try:
        yield client
    finally:
        endpoint.close(tid)
        await client.close()


async def _drive(
    client: Any,
    conversation: AgentClient,
    trajectory: Trajectory,
    row: dict,
    rollout: RolloutFn | None,
    env: Callable[[], Environment] | None,
    toolset: ToolSet,
    context: dict,
) -> None:
    group, sample = trajectory.group, trajectory.sample
    try:
        if rollout is not None:
            tools = toolset.bound(trajectory.record_tool)
            context = {**context, "trajectory": trajectory, "tools": tools, "group": group, "sample": sample}
            _take_return(trajectory, await rollout(client, row, **context))
        else:
            await drive_environment(client, env(), row)
        # A limit the rollout caught (a framework may turn the endpoint's 400 into its own error) still ended it.
        trajectory.finish_reason = conversation.limit or ("max_tokens" if conversation.budget_exhausted else "stop")
    except RolloutLimit as limit:
        trajectory.finish_reason = limit.reason
    except Exception as e:  # noqa: BLE001 - one failing rollout must not end the others
        if conversation.limit is not None:  # over HTTP a limit reaches the rollout as the client's error
            trajectory.finish_reason = conversation.limit
        else:
            trajectory.finish_reason, trajectory.error = "error", f"{type(e).__name__}: {e}"


async def drive_environment(client: Any, environment: Environment, row: dict) -> None:
    """Run `environment` for one trajectory: observe, generate, step, until done or a limit."""
    try:
        messages = _messages(await _maybe_await(environment.reset(row)))
        while True:
            response = await client.chat.completions.create(messages=messages)
            action = response.choices[0].message.content or ""
            observation, reward, done = _step_result(await _maybe_await(environment.step(action)))
            client.trajectory.add_reward(reward)
            if done:
                return
            messages = [*messages, {"role": "assistant", "content": action}, *_messages(observation)]
    finally:
        close = getattr(environment, "close", None)
        if callable(close):
            await _maybe_await(close())


def _take_return(trajectory: Trajectory, value: Any) -> None:
    """A rollout's return value -> the trajectory's final reward (and info)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float | dict):
        raise TypeError(f"rollout returned {type(value).__name__}; expected a float, a dict with 'reward', or None")
    if isinstance(value, dict):
        info = dict(value)
        reward = info.pop("reward", None)
        trajectory.info.update(info)
        trajectory.reward = None if reward is None else float(reward)
    else:
        trajectory.reward = float(value)


def _step_result(result: tuple) -> tuple[Observation, float, bool]:
    """(obs, reward, done) or gymnasium's (obs, reward, terminated, truncated, info)."""
    if len(result) == 5:
        observation, reward, terminated, truncated, _ = result
        return observation, float(reward), bool(terminated or truncated)
    observation, reward, done = result
    return observation, float(reward), bool(done)


def _messages(observation: Observation) -> list[dict]:
    if isinstance(observation, str):
        return [{"role": "user", "content": observation}]
    return [dict(m) for m in observation]


async def _maybe_await(value: Any) -> Any:
    return await value if inspect.isawaitable(value) else value
