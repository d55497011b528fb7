"""An OpenAI-style chat client for one trajectory, served by forge_nb's generator.

``await client.chat.completions.create(messages=..., tools=..., temperature=..., max_tokens=...)``
returns an `openai.types.chat.ChatCompletion`; every call's exact prompt delta, generated token ids
and logprobs are recorded into `client.trajectory` (see `trajectory`). A conversation must grow by
appending: call k+1's messages are call k's, the assistant reply (the returned message or any assistant
dict: the recorded tokens stand for it), then new messages (tool results, user turns); editing earlier
messages raises `ConversationError` (the recorded tokens would no longer be what the model saw).

`Limits` are enforced here: a call past `max_turns`, or with no room left in `max_total_tokens`,
raises `RolloutLimit` (the runner turns it into the finish reason); each call's `max_tokens` is
capped by `Limits.max_tokens` and the tokens left. One call at a time per client (one conversation);
concurrency comes from many trajectories. Other OpenAI parameters (`model`, `seed`, `user`, ...) are
accepted and ignored; `n > 1` and `stream=True` are refused.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import CompletionUsage

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.tool_calls import as_message, parse_tool_calls, render
from forge_nb.agents.tools import ToolSet, tool_schema
from forge_nb.agents.trajectory import Trajectory, Turn, next_prompt_ids
from forge_nb.engines.base import SamplingParams, cut_at_stop


@dataclass(frozen=True)
class Limits:
    """Per trajectory: at most `max_turns` model calls and `max_total_tokens` tokens (prompt and all
    turns); each call generates at most `max_tokens`."""

    max_turns: int = 8
    max_total_tokens: int = 2048
    max_tokens: int = 256


class RolloutLimit(Exception):
    """A trajectory reached a limit; `reason` is its finish reason ("max_turns" or "max_tokens")."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason


class ConversationError(ValueError):
    """A call whose messages do not extend the previous call's conversation."""


class AgentClient:
    """`client.chat.completions.create(...)` for one `trajectory`, generating through `batcher`.

    `sampling` gives every call's defaults (temperature, top_p, max_tokens, seed, stop); without it,
    temperature 1 and `limits.max_tokens`.
    """

    def __init__(
        self,
        batcher: GenerationBatcher,
        tokenizer,
        trajectory: Trajectory,
        limits: Limits | None = None,
        sampling: SamplingParams | None = None,
        model: str = "forge_nb-policy",
    ) -> None:
        self.batcher, self.tokenizer, self.trajectory = batcher, tokenizer, trajectory
        self.limits = limits or Limits()
        # Defaults of every call; a call's own temperature / max_tokens / ... override them.
        self.sampling = sampling or SamplingParams(max_tokens=self.limits.max_tokens)
        self.model = model
        self.budget_exhausted = False  # a completion was cut because the token budget ran out
        self._history: list[dict] = []  # the messages the last prompt was rendered from
        self._schemas: list[dict] = []
        self._in_call = False
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self.create))

    async def create(
        self,
        messages: Sequence[Any],
        tools: ToolSet | Sequence[Callable | dict] | None = None,
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        max_completion_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        n: int = 1,
        stream: bool = False,
        **ignored: Any,
    ) -> ChatCompletion:
        """One model call on `messages` -> a ChatCompletion with one choice (tool calls parsed)."""
        if n != 1 or stream:
            raise ValueError("forge_nb's chat client returns one whole completion per call: n=1, stream=False")
        if self._in_call:
            raise ConversationError("one call at a time per trajectory: await each call before the next")
        self._in_call = True
        try:
            return await self._create(messages, tools, temperature, top_p, max_tokens or max_completion_tokens, stop)
        finally:
            self._in_call = False

    async def _create(
        self,
        messages: Sequence[Any],
        tools: ToolSet | Sequence[Callable | dict] | None,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
        stop: str | Sequence[str] | None,
    ) -> ChatCompletion:
        turns = len(self.trajectory.turns)
        if turns >= self.limits.max_turns:
            raise RolloutLimit("max_turns", f"call {turns + 1} is past max_turns={self.limits.max_turns}")
        schemas = _schemas(tools)
        messages = [as_message(m) for m in messages]
        prompt_ids, delta = self._prompt(messages, schemas)
        room = self.limits.max_total_tokens - len(prompt_ids)
        if self.budget_exhausted or room <= 0:
            self.budget_exhausted = True
            raise RolloutLimit("max_tokens", f"no room left in max_total_tokens={self.limits.max_total_tokens}")
        wanted = max_tokens or self.sampling.max_tokens
        budget = min(wanted, self.limits.max_tokens, room)
        sampling = SamplingParams(
            n=1,
            temperature=self.sampling.temperature if temperature is None else temperature,
            top_p=self.sampling.top_p if top_p is None else top_p,
            max_tokens=budget,
            seed=self.sampling.seed,
            stop=(stop,) if isinstance(stop, str) else tuple(stop or self.sampling.stop),
            keep_prefix=True,  # the next turn extends this prompt and reply
        )
        completion = await self.batcher.generate(prompt_ids, sampling)
        text = self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        self.trajectory.turns.append(
            Turn(delta, list(completion.token_ids), list(completion.logprobs), text, completion.finish_reason)
        )
        if completion.finish_reason == "length" and budget == room and budget < min(wanted, self.limits.max_tokens):
            self.budget_exhausted = True
        self._history, self._schemas = messages, schemas
        self.trajectory.messages = [*messages, {"role": "assistant", "content": text}]
        shown = cut_at_stop(text, sampling.stop)[0]  # as OpenAI: the content ends before the stop string
        return self._completion(shown, completion.finish_reason, len(prompt_ids), len(completion.token_ids), schemas)

    def _prompt(self, messages: list[dict], schemas: list[dict]) -> tuple[list[int], list[int]]:
        """-> (the prompt ids of this call, its delta: the tokens it adds to the conversation)."""
        if not self.trajectory.turns:
            text = render(self.tokenizer, messages, schemas, add_generation_prompt=True)
            ids = self.tokenizer(text, add_special_tokens=False)["input_ids"]
            return ids, ids
        n = len(self._history)
        for i, (old, new) in enumerate(zip(self._history, messages)):
            if (old["role"], old.get("content") or "") != (new["role"], new.get("content") or ""):
                raise ConversationError(f"message {i} changed since the previous call; append, do not edit")
        if len(messages) <= n or messages[n]["role"] != "assistant":
            raise ConversationError(
                f"call {len(self.trajectory.turns) + 1}: message {n} must be the assistant's reply to the previous "
                "call (append response.choices[0].message), followed by the new messages"
            )
        if schemas != self._schemas:
            raise ConversationError("the tools changed within a conversation; give the same tools to every call")
        last = self.trajectory.turns[-1]
        prompt = self.trajectory.last_prompt_ids()
        return next_prompt_ids(self.tokenizer, prompt, last.completion_ids, self._history, messages[n + 1 :], schemas)

    def _completion(self, text: str, reason: str, prompt: int, generated: int, schemas: list[dict]) -> ChatCompletion:
        turn = len(self.trajectory.turns) - 1
        parsed = parse_tool_calls(text, id_prefix=f"call_{turn}_") if schemas else None
        calls = parsed.tool_calls if parsed else []
        message = ChatCompletionMessage(
            role="assistant", content=parsed.content if parsed else text, tool_calls=calls or None
        )
        finish = "tool_calls" if calls else ("length" if reason == "length" else "stop")
        t = self.trajectory
        return ChatCompletion(
            id=f"chatcmpl-{t.group}-{t.sample}-{len(t.turns)}",
            object="chat.completion",
            created=int(time.time()),
            model=self.model,
            choices=[Choice(index=0, finish_reason=finish, message=message)],
            usage=CompletionUsage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated),
        )


def _schemas(tools: ToolSet | Sequence[Callable | dict] | None) -> list[dict]:
    """Tool schemas from a ToolSet, functions, or OpenAI schema dicts."""
    if tools is None:
        return []
    if isinstance(tools, ToolSet):
        return list(tools.schemas)
    return [t if isinstance(t, dict) else tool_schema(t) for t in tools]
