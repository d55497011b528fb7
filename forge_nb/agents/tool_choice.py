"""OpenAI's `tool_choice`, served without constrained decoding: a call that must be a tool call starts the
assistant's reply with the opening of one, in the Hermes / Qwen format the parser reads (`tool_calls`).

- None or "auto": the model may call tools; calls are parsed.
- "none": nothing is parsed as a call (the reply is text).
- "required": the reply starts with ``<tool_call>\\n{"name": "`` (with one tool, its whole name and
  ``"arguments":``): the model writes the rest of the call. With several tools it writes the name too, and
  may write one that is none of them (OpenAI's grammar would not let it): a call to an unknown tool, which
  `ToolSet.call` answers with an error the model reads (counted in `tool_errors`) and a framework handles its
  own way (the Agents SDK raises `ModelBehaviorError`).
- a named function (chat: ``{"type": "function", "function": {"name": f}}``; the Responses API's
  ``{"type": "function", "name": f}`` is turned into that by `responses_api`): the reply starts with
  ``<tool_call>\\n{"name": "f", "arguments":``.

The forced opening is prompt, not policy: its tokens go into the turn's prompt delta (loss mask 0), the reply's
text (what the caller, the parser and the rewards read) begins with it. What the model writes after it is its
own and may still be malformed (a broken call is parsed into one whose arguments say so, as always). The
opening ends where the tokenizer splits such text itself (``"arguments":`` then `` {"...``, not a lone space
token), so the model continues a split it would have made. vLLM constrains the whole call with a grammar
instead; forge_nb's engines sample freely.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

OPENING = '<tool_call>\n{"name": '


def forced_opening(tool_choice: Any, schemas: Sequence[dict]) -> str:
    """The text the reply must start with under `tool_choice`, given the call's tool `schemas` (OpenAI
    function schemas) -> "" when nothing is forced. ValueError (a 400 on the endpoint) for a choice that
    names no tool of the call, needs tools the call has none of, or is not one of OpenAI's forms."""
    if not tool_choice or tool_choice in ("auto", "none"):  # (not given: None, or the openai package's omit)
        return ""
    names = [s.get("function", s).get("name") for s in schemas]
    if tool_choice == "required":
        if not names:
            raise ValueError("tool_choice 'required' needs tools: the call has none")
        return _opening(names[0]) if len(names) == 1 else OPENING + '"'
    name = _named(tool_choice)
    if name not in names:
        raise ValueError(f"tool_choice names the function {name!r}, which is not one of the call's tools {names}")
    return _opening(name)


def parses_calls(tool_choice: Any, schemas: Sequence[dict]) -> bool:
    """Whether the reply's tool-call blocks become tool calls (not under "none", nor without tools)."""
    return bool(schemas) and tool_choice != "none"


def _opening(name: str) -> str:
    return f'{OPENING}{json.dumps(name)}, "arguments":'


def _named(tool_choice: Any) -> str:
    function = tool_choice.get("function") if isinstance(tool_choice, dict) else None
    name = function.get("name") if isinstance(function, dict) else None
    if not (isinstance(tool_choice, dict) and tool_choice.get("type") == "function" and isinstance(name, str)):
        raise ValueError(
            f"tool_choice {tool_choice!r} is not served: 'auto', 'none', 'required' or "
            '{"type": "function", "function": {"name": ...}}'
        )
    return name
