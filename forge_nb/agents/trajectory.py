"""Trajectories: the exact token stream of one multi-turn conversation, as the generator saw it.

A `Trajectory` is a list of `Turn`s, one per model call. Turn k contributes its prompt delta (the
tokens added since the previous completion: the whole first prompt for turn 0; afterwards the template
glue that closes the assistant turn, tool results, environment messages and the next generation
prompt; loss mask 0) and then its generated tokens with their sampling logprobs (loss mask 1). The
concatenation is exactly what the backend got as its last prompt plus its last output: nothing is
re-tokenised, so the trainer scores the tokens the policy sampled.

`next_prompt_ids` builds the next call's prompt as ``previous prompt + generated ids + delta``.

Segments: a call whose messages do not extend the previous call's (the tools or the system prompt
changed, the history was trimmed, summarised or edited, or the template rewrites earlier turns) starts
a new segment of the same trajectory: its first turn's delta is its whole prompt. `segments()` gives
each segment as a trajectory of its own; each is trained as its own sequence (its prompt, then the
policy's tokens masked in), all with the trajectory's reward and advantage. The
delta is the tokenisation of only the new text: the chat template is rendered for the conversation up
to the model's reply and for the conversation with the new messages and the generation prompt; the
first must be a prefix of the second, and only the suffix is tokenised. Caveat: a template that
rewrites earlier turns when later ones arrive (Qwen3 drops earlier ``<think>`` blocks, some templates
re-format earlier tool calls) fails that check: `TemplateRewriteError` says so, since no token stream
can then be both what the generator saw and what the template renders.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from forge_nb.agents.tool_calls import render

FINISH_REASONS = ("stop", "max_turns", "max_tokens", "error")
#: The columns of `Trajectory.summary` (besides "trained_tokens").
SUMMARY = (
    "group sample finish_reason error num_turns num_tokens reward total_reward tool_calls tool_errors request_errors"
).split()


class TemplateRewriteError(ValueError):
    """The chat template renders earlier turns differently once new messages follow them."""


@dataclass
class Turn:
    """One model call: `prompt_delta_ids` [D] (mask 0) then `completion_ids` [C] with `logprobs` [C]
    (mask 1). `finish_reason` is the backend's ("stop" at EOS or a stop string, "length" at the call's
    max_tokens); `text` is the completion without special tokens (after the opening of a tool call, when
    `tool_choice` forced one: `agents.tool_choice`; its tokens end the prompt delta); `reward` is this turn's own reward
    (an environment's step reward, or one a rollout added)."""

    prompt_delta_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
    reward: float = 0.0
    tool_calls: int = 0
    tool_errors: int = 0
    segment: int = 0  # which segment of the trajectory this turn belongs to (see the module docstring)
    new_segment: str | None = None  # on a segment's first turn after the first: why the prompt did not extend


@dataclass
class Trajectory:
    """One rollout of one row: G of them per row form a GRPO group (`group` is the row's index,
    `sample` the sample's index in the group).

    `reward` is the rollout's final reward (None: none was returned, the live rewards decide);
    `finish_reason` is one of `FINISH_REASONS`; `error` says what failed when it is "error";
    `info` holds what a rollout returned besides its reward; `messages` is the conversation as of the
    last call, with the model's last reply (for reading, not for training: `token_ids` is that).
    """

    row: dict
    group: int = 0
    sample: int = 0
    turns: list[Turn] = field(default_factory=list)
    reward: float | None = None
    finish_reason: str | None = None
    error: str | None = None
    info: dict[str, Any] = field(default_factory=dict)
    messages: list[dict] = field(default_factory=list)
    request_errors: int = 0  # requests to its endpoint URL refused as malformed (400): the agent's format errors

    def segments(self) -> list[Trajectory]:
        """One trajectory per segment (same row, group, sample, reward, info; that segment's turns), in
        order; a trajectory without turns is one empty segment."""
        if not self.turns or self.turns[-1].segment == 0:
            return [self]
        parts: dict[int, list[Turn]] = {}
        for turn in self.turns:
            parts.setdefault(turn.segment, []).append(turn)
        return [replace(self, turns=turns) for turns in parts.values()]

    @property
    def num_segments(self) -> int:
        return self.turns[-1].segment + 1 if self.turns else 1

    def token_ids(self) -> list[int]:
        """Every token of the conversation [T] = sum over turns of D_k + C_k (one segment's: see
        `segments`; over several segments this concatenates sequences that were never one prompt)."""
        return [t for turn in self.turns for t in (*turn.prompt_delta_ids, *turn.completion_ids)]

    def loss_mask(self) -> list[int]:
        """[T]: 1 on the policy's own tokens, 0 on prompts, template glue, tool results, env messages."""
        return [m for turn in self.turns for m in [0] * len(turn.prompt_delta_ids) + [1] * len(turn.completion_ids)]

    def logprobs(self) -> list[float]:
        """[T]: the sampling logprob of each generated token, 0.0 where the mask is 0."""
        return [lp for turn in self.turns for lp in [0.0] * len(turn.prompt_delta_ids) + list(turn.logprobs)]

    @property
    def prompt_ids(self) -> list[int]:
        """The first prompt [P] (what a single-turn `Episode` calls its prompt)."""
        return list(self.turns[0].prompt_delta_ids) if self.turns else []

    def completion_ids(self) -> list[int]:
        """Everything after the first prompt [T - P]: the trainer's completion, with `completion_mask`."""
        return self.token_ids()[len(self.prompt_ids) :]

    def completion_mask(self) -> list[int]:
        return self.loss_mask()[len(self.prompt_ids) :]

    def completion_logprobs(self) -> list[float]:
        return self.logprobs()[len(self.prompt_ids) :]

    def last_prompt_ids(self) -> list[int]:
        """What the backend was given as the prompt of the last call (the last segment's tokens before
        its last completion)."""
        if not self.turns:
            return []
        ids = self.segments()[-1].token_ids()
        return ids[: len(ids) - len(self.turns[-1].completion_ids)]

    @property
    def turn_rewards(self) -> list[float]:
        return [turn.reward for turn in self.turns]

    @property
    def total_reward(self) -> float:
        """The per-turn rewards plus the final reward."""
        return sum(self.turn_rewards) + (self.reward or 0.0)

    @property
    def num_turns(self) -> int:
        return len(self.turns)

    @property
    def num_tokens(self) -> int:
        return sum(len(turn.prompt_delta_ids) + len(turn.completion_ids) for turn in self.turns)

    @property
    def tool_calls(self) -> int:
        return sum(turn.tool_calls for turn in self.turns)

    @property
    def tool_errors(self) -> int:
        return sum(turn.tool_errors for turn in self.turns)

    def summary(self) -> dict:
        """A flat dict for tables (no token lists)."""
        out = {name: getattr(self, name) for name in SUMMARY} | {"trained_tokens": sum(self.loss_mask())}
        return out | ({"segments": self.num_segments} if self.num_segments > 1 else {})

    def add_reward(self, value: float) -> None:
        """Add `value` to the latest turn's reward (a per-turn reward from inside a rollout)."""
        if not self.turns:
            raise ValueError("add_reward: the trajectory has no turn yet (call the model first)")
        self.turns[-1].reward += float(value)

    def record_tool(self, result: Any) -> None:
        """Count one tool call (a `tools.ToolResult`) on the latest turn."""
        if self.turns:
            self.turns[-1].tool_calls += 1
            self.turns[-1].tool_errors += int(result.error)


def next_prompt_ids(
    tokenizer,
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    history: Sequence[dict],
    new_messages: Sequence[Any],
    schemas: Sequence[dict] = (),
) -> tuple[list[int], list[int]]:
    """-> (next prompt ids = `prompt_ids` + `completion_ids` + delta, delta).

    `history` are the messages `prompt_ids` was rendered from; the model's reply (decoded from
    `completion_ids`) follows them, then `new_messages`. The delta [D] is the tokenisation of: the
    template's glue after the reply that the model did not generate (e.g. "\\n" after its
    ``<|im_end|>``, or the whole end-of-turn marker when the reply was cut at max_tokens), then the
    new messages' text and the generation prompt.
    """
    text = tokenizer.decode(list(completion_ids), skip_special_tokens=True)
    reply = [*history, {"role": "assistant", "content": text}]
    prompt = render(tokenizer, history, schemas, add_generation_prompt=True)
    before = render(tokenizer, reply, schemas, add_generation_prompt=False)
    after = render(tokenizer, [*reply, *new_messages], schemas, add_generation_prompt=True)
    if not before.startswith(prompt) or not after.startswith(before):
        raise TemplateRewriteError(
            "the chat template renders the earlier turns differently once new messages follow them; "
            "forge_nb keeps the tokens the model saw and cannot extend them with this template"
        )
    body = before[len(prompt) :]  # the reply as the template writes it, with its end-of-turn glue
    end = body.find(text) + len(text) if text in body else _find_stripped(body, text)
    glue = body[end:]
    last = completion_ids[-1] if completion_ids else None
    if last is not None and last in tokenizer.all_special_ids:
        marker = tokenizer.decode([last])
        glue = glue[len(marker) :] if glue.startswith(marker) else glue
    delta_text = glue + after[len(before) :]
    delta = tokenizer(delta_text, add_special_tokens=False)["input_ids"]
    return [*prompt_ids, *completion_ids, *delta], delta


def _find_stripped(body: str, text: str) -> int:
    """End of the reply in `body` for a template that strips the reply's whitespace."""
    stripped = text.strip()
    at = body.find(stripped)
    if at < 0:
        raise TemplateRewriteError("the chat template does not write the model's reply as it was generated")
    return at + len(stripped)
