"""An OpenAI-style chat client for one trajectory, served by forge_nb's generator.

``await client.chat.completions.create(messages=..., tools=..., temperature=..., max_tokens=...)``
returns an `openai.types.chat.ChatCompletion`; every call's exact prompt delta, generated token ids
and logprobs are recorded into `client.trajectory` (see `trajectory`). A conversation that grows by
appending (call k+1's messages are call k's, the assistant reply -- the returned message or any
assistant dict: the recorded tokens stand for it -- then new messages) extends the recorded tokens. A
call that does not (the tools or an earlier message changed, the history was trimmed or summarised,
the reply was not appended, the template rewrites earlier turns) starts a new segment of the
trajectory with its whole prompt (`Trajectory.segments`); the turn records why in `new_segment`.

This client is the in-process form; the HTTP endpoint (`agents.endpoint`) keeps one of these per
trajectory on the server side, so every check below holds for a real `openai.AsyncOpenAI` too.

`Limits` are enforced here: a call past `max_turns`, or with no room left in `max_total_tokens`,
raises `RolloutLimit` (the runner turns it into the finish reason); each call's `max_tokens` is
capped by `Limits.max_tokens` and the tokens left. One call at a time per client (one conversation);
concurrency comes from many trajectories. Other OpenAI parameters (`model`, `seed`, `user`, ...) are
accepted and ignored; `n > 1` and `stream=True` are refused. `complete` is the raw-text form
(``/v1/completions``).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import asynccontextmanager
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from openai.types import Completion, CompletionChoice
from openai.types.chat import ChatCompletion, ChatCompletionMessage
from openai.types.chat.chat_completion import Choice
from openai.types.completion_usage import CompletionUsage

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.tool_calls import as_message, parse_tool_calls, render
from forge_nb.agents.tool_choice import forced_opening, parses_calls
from forge_nb.agents.tools import ToolSet, tool_schema
from forge_nb.agents.trajectory import TemplateRewriteError, Trajectory, Turn, next_prompt_ids
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
    """A call the conversation cannot take (a second call while one is running)."""


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
        self.limit: str | None = None  # the limit a call ran into ("max_turns", "max_tokens"), if any
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
        tool_choice: Any = None,
        **ignored: Any,
    ) -> ChatCompletion:
        """One model call on `messages` -> a ChatCompletion with one choice (tool calls parsed, unless
        ``tool_choice="none"``; under "required" or a named function the reply starts with the opening of
        a call: `agents.tool_choice`)."""
        async with self._one_call(n, stream):
            schemas = tool_schemas(tools)
            opening = forced_opening(tool_choice, schemas)
            messages = [as_message(m) for m in messages]
            prompt_ids, delta, why = self._prompt(messages, schemas)
            if opening:  # prompt, not policy: in the turn's delta (mask 0), and the start of the reply's text
                forced = self._ids(opening)
                prompt_ids, delta = [*prompt_ids, *forced], [*delta, *forced]
            text, reason, generated, stop = await self._generate(
                prompt_ids, delta, why, temperature, top_p, max_tokens or max_completion_tokens, stop, opening
            )
            self._history, self._schemas = messages, schemas
            self.trajectory.messages = [*messages, {"role": "assistant", "content": text}]
            shown = opening + cut_at_stop(text[len(opening) :], stop)[0]  # as OpenAI: it ends before the stop
            return self._completion(shown, reason, len(prompt_ids), generated, parses_calls(tool_choice, schemas))

    async def complete(
        self,
        prompt: str | Sequence[int],
        temperature: float | None = None,
        top_p: float | None = None,
        max_tokens: int | None = None,
        stop: str | Sequence[str] | None = None,
        n: int = 1,
        stream: bool = False,
        **ignored: Any,
    ) -> Completion:
        """A raw completion of `prompt` (text, tokenised without special tokens, or token ids [P]) ->
        an openai `Completion`. It extends the trajectory when it starts with the previous call's prompt
        and completion tokens, else it starts a new segment."""
        async with self._one_call(n, stream):
            ids = list(prompt) if not isinstance(prompt, str) else self._ids(prompt)
            previous = self.trajectory.segments()[-1].token_ids() if self.trajectory.turns else []
            extends = bool(previous) and ids[: len(previous)] == previous
            delta = ids[len(previous) :] if extends else ids
            why = None if extends or not previous else "the prompt does not start with the previous call's tokens"
            text, reason, generated, stop = await self._generate(ids, delta, why, temperature, top_p, max_tokens, stop)
            self._history, self._schemas = [], []  # a chat call after this one starts a new segment
            shown = cut_at_stop(text, stop)[0]
            t = self.trajectory
            finish = "length" if reason == "length" else "stop"
            return Completion(
                id=f"cmpl-{t.group}-{t.sample}-{len(t.turns)}",
                object="text_completion",
                created=int(time.time()),
                model=self.model,
                choices=[CompletionChoice(index=0, text=shown, finish_reason=finish)],
                usage=_usage(len(ids), generated),
            )

    @asynccontextmanager
    async def _one_call(self, n: int, stream: bool) -> AsyncIterator[None]:
        if n != 1 or stream:
            raise ValueError("forge_nb's chat client returns one whole completion per call: n=1, stream=False")
        if self._in_call:
            raise ConversationError("one call at a time per trajectory: await each call before the next")
        turns = len(self.trajectory.turns)
        if turns >= self.limits.max_turns:
            self.limit = "max_turns"
            raise RolloutLimit("max_turns", f"call {turns + 1} is past max_turns={self.limits.max_turns}")
        self._in_call = True
        try:
            yield
        finally:
            self._in_call = False

    async def _generate(
        self,
        prompt_ids: list[int],
        delta: list[int],
        why: str | None,
        temperature: float | None,
        top_p: float | None,
        max_tokens: int | None,
        stop: str | Sequence[str] | None,
        opening: str = "",
    ) -> tuple[str, str, int, tuple[str, ...]]:
        """Sample one completion of `prompt_ids` and record it as a turn -> (text: `opening`, the end of
        the prompt that the reply was forced to start with, then the completion; the backend's finish
        reason, tokens generated, the stop strings)."""
        room = self.limits.max_total_tokens - len(prompt_ids)
        if self.budget_exhausted or room <= 0:
            self.budget_exhausted, self.limit = True, "max_tokens"
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
        text = opening + self.tokenizer.decode(completion.token_ids, skip_special_tokens=True)
        turns = self.trajectory.turns
        segment = turns[-1].segment + (why is not None) if turns else 0
        turns.append(Turn(delta, list(completion.token_ids), list(completion.logprobs), text, completion.finish_reason))
        turns[-1].segment, turns[-1].new_segment = segment, why
        if completion.finish_reason == "length" and budget == room and budget < min(wanted, self.limits.max_tokens):
            self.budget_exhausted = True
        return text, completion.finish_reason, len(completion.token_ids), sampling.stop

    def _ids(self, text: str) -> list[int]:
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def _prompt(self, messages: list[dict], schemas: list[dict]) -> tuple[list[int], list[int], str | None]:
        """-> (the prompt ids of this call, its delta: the tokens it adds to the trajectory, why it starts
        a new segment: None when it extends the previous call or is the first)."""
        why = self._not_extending(messages, schemas) if self.trajectory.turns else None
        if self.trajectory.turns and why is None:
            n, last = len(self._history), self.trajectory.turns[-1]
            prompt = self.trajectory.last_prompt_ids()
            try:
                ids, delta = next_prompt_ids(
                    self.tokenizer, prompt, last.completion_ids, self._history, messages[n + 1 :], schemas
                )
                return ids, delta, None
            except TemplateRewriteError:
                why = "the chat template renders the earlier turns differently once new messages follow them"
        ids = self._ids(render(self.tokenizer, messages, schemas, add_generation_prompt=True))
        return ids, ids, why

    def _not_extending(self, messages: list[dict], schemas: list[dict]) -> str | None:
        """Why `messages` (with `schemas`) do not extend the previous call's conversation, or None."""
        n = len(self._history)
        if schemas != self._schemas:
            return "the tools changed"
        for i, (old, new) in enumerate(zip(self._history, messages)):
            if (old["role"], old.get("content") or "") != (new["role"], new.get("content") or ""):
                return f"message {i} ({old['role']}) changed or was dropped"
        if len(messages) <= n or messages[n]["role"] != "assistant":
            return f"message {n} is not the assistant's reply to the previous call"
        return None

    def _completion(self, text: str, reason: str, prompt: int, generated: int, parse: bool) -> ChatCompletion:
        turn = len(self.trajectory.turns) - 1
        parsed = parse_tool_calls(text, id_prefix=f"call_{turn}_") if parse else None
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
            usage=_usage(prompt, generated),
        )


def tool_schemas(tools: ToolSet | Sequence[Callable | dict] | None) -> list[dict]:
    """Tool schemas from a ToolSet, functions, or OpenAI schema dicts."""
    if tools is None:
        return []
    if isinstance(tools, ToolSet):
        return list(tools.schemas)
    return [t if isinstance(t, dict) else tool_schema(t) for t in tools]


def _usage(prompt: int, generated: int) -> CompletionUsage:
    return CompletionUsage(prompt_tokens=prompt, completion_tokens=generated, total_tokens=prompt + generated)
