"""Tools in the prompt and tool calls out of the completion, in the Hermes / Qwen format.

Rendering: ``tokenizer.apply_chat_template(messages, tools=schemas, add_generation_prompt=True)`` when
the model's chat template renders tools (Qwen2.5, Llama 3.1, Hermes, ...). A template that ignores
them (SmolLM2-135M-Instruct's renders only role and content) gets the Hermes / Qwen convention
written into the messages instead (`hermes_messages`):

- the system message (or a new one) ends with `tools_block(schemas)`: the schemas, one JSON object a
  line inside ``<tools></tools>``, and the instruction to answer with
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``;
- a ``{"role": "tool"}`` message becomes a user message ``<tool_response>\\n...\\n</tool_response>``;
- an assistant message's `tool_calls` are written into its content as ``<tool_call>`` blocks (unless
  the content already holds them, as the model's own text does).

Parsing (`parse_tool_calls`): every ``<tool_call>...</tool_call>`` block (the closing tag may be
missing at the end of a cut completion) is JSON ``{"name": str, "arguments": object}``; whitespace
around and inside is free. A block that is not valid JSON still becomes a tool call, with the name
found in it (or "") and the block's raw text as `arguments`: running it (`ToolSet.call`) gives the
model the parse error as its observation, so malformed calls are seen and counted, never dropped.
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

TOOL_CALL_BLOCK = re.compile(r"<tool_call>(.*?)(?:</tool_call>|\Z)", re.S)
NAME_IN_BROKEN_JSON = re.compile(r'"name"\s*:\s*"([^"]*)"')
_PROBE_NAME = "forge_nb_probe_tool"
_RENDERS_TOOLS: dict[str, bool] = {}  # chat template -> whether it renders tools
_PROBE_TOOL = {"type": "function", "function": {"name": _PROBE_NAME, "description": "probe", "parameters": {}}}

TOOLS_INSTRUCTION = (
    "You may call one or more functions to assist with the user query.\n\n"
    "You are provided with function signatures within <tools></tools> XML tags:\n<tools>\n{tools}\n</tools>\n\n"
    "For each function call, return a json object with function name and arguments within <tool_call></tool_call> "
    'XML tags:\n<tool_call>\n{{"name": <function-name>, "arguments": <args-json-object>}}\n</tool_call>'
)


@dataclass
class ParsedCompletion:
    """A completion's text split into `content` (tool-call blocks removed, stripped; None when empty
    and there are tool calls, as OpenAI returns it) and OpenAI-shaped `tool_calls`."""

    content: str | None
    tool_calls: list[dict] = field(default_factory=list)


def template_renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template writes the `tools=` it is given into the prompt."""
    template = getattr(tokenizer, "chat_template", None)
    if not isinstance(template, str) or not template:
        return False
    if template not in _RENDERS_TOOLS:
        messages = [{"role": "user", "content": "x"}]
        try:
            text = tokenizer.apply_chat_template(
                messages, tools=[_PROBE_TOOL], tokenize=False, add_generation_prompt=True
            )
        except Exception:  # noqa: BLE001 - a template that chokes on tools does not render them
            text = ""
        _RENDERS_TOOLS[template] = _PROBE_NAME in text
    return _RENDERS_TOOLS[template]


def tools_block(schemas: Sequence[dict]) -> str:
    """The Hermes / Qwen system-prompt text presenting `schemas` (OpenAI function schemas)."""
    return TOOLS_INSTRUCTION.format(tools="\n".join(json.dumps(s) for s in schemas))


def as_message(message: Any) -> dict:
    """A chat message as a plain dict (an `openai` message object is dumped without its None fields);
    content given as a list of parts (``[{"type": "text", "text": ...}]``, what some frameworks send)
    becomes their text, joined."""
    out = message.model_dump(exclude_none=True) if hasattr(message, "model_dump") else dict(message)
    if isinstance(out.get("content"), list):
        out["content"] = "".join(p.get("text", "") if isinstance(p, dict) else str(p) for p in out["content"])
    return out


def hermes_messages(messages: Sequence[Any], schemas: Sequence[dict]) -> list[dict]:
    """`messages` with tools, tool calls and tool results written as text (see the module docstring),
    for a template that renders only role and content."""
    out = []
    for m in map(as_message, messages):
        role, content = m["role"], m.get("content") or ""
        if role == "tool":
            out.append({"role": "user", "content": f"<tool_response>\n{content}\n</tool_response>"})
        elif role == "assistant" and m.get("tool_calls") and "<tool_call>" not in content:
            blocks = [_call_block(c) for c in m["tool_calls"]]
            out.append({"role": "assistant", "content": "\n".join(([content] if content else []) + blocks)})
        else:
            out.append({"role": role, "content": content})
    if schemas:
        block = tools_block(schemas)
        if out and out[0]["role"] == "system":
            out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{block}".lstrip()}
        else:
            out.insert(0, {"role": "system", "content": block})
    return out


def render(tokenizer, messages: Sequence[Any], schemas: Sequence[dict] = (), add_generation_prompt: bool = True) -> str:
    """The prompt text of `messages` (and tool `schemas`) under the tokenizer's chat template."""
    if template_renders_tools(tokenizer):
        plain = [_native(as_message(m)) for m in messages]
        return tokenizer.apply_chat_template(
            plain, tools=list(schemas) or None, tokenize=False, add_generation_prompt=add_generation_prompt
        )
    plain = hermes_messages(messages, schemas)
    return tokenizer.apply_chat_template(plain, tokenize=False, add_generation_prompt=add_generation_prompt)


def parse_tool_calls(text: str, id_prefix: str = "call_") -> ParsedCompletion:
    """Hermes ``<tool_call>`` blocks in `text` -> content and OpenAI-shaped tool calls
    (``{"id": id_prefix + k, "type": "function", "function": {"name", "arguments": JSON string}}``)."""
    calls = []
    for k, block in enumerate(TOOL_CALL_BLOCK.findall(text)):
        raw = block.strip()
        try:
            obj = json.loads(raw)
        except json.JSONDecodeError:
            obj = None
        if isinstance(obj, dict) and isinstance(obj.get("name"), str):
            arguments = obj.get("arguments", obj.get("parameters", {}))
            arguments = arguments if isinstance(arguments, str) else json.dumps(arguments)
            calls.append(_call(f"{id_prefix}{k}", obj["name"], arguments))
        else:
            found = NAME_IN_BROKEN_JSON.search(raw)
            calls.append(_call(f"{id_prefix}{k}", found.group(1) if found else "", raw))
    content = TOOL_CALL_BLOCK.sub("", text).strip()
    return ParsedCompletion(content if content or not calls else None, calls)


def _call(call_id: str, name: str, arguments: str) -> dict:
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}}


def _call_block(call: dict) -> str:
    fn = call["function"]
    try:
        arguments = json.loads(fn["arguments"]) if isinstance(fn["arguments"], str) else fn["arguments"]
    except json.JSONDecodeError:
        arguments = fn["arguments"]
    return f"<tool_call>\n{json.dumps({'name': fn['name'], 'arguments': arguments})}\n</tool_call>"


def _native(message: dict) -> dict:
    """A message for a template that renders tools: arguments as objects (as HF templates expect)."""
    if not message.get("tool_calls"):
        return {**message, "content": message.get("content") or ""}
    calls = []
    for c in message["tool_calls"]:
        fn = dict(c["function"])
        if isinstance(fn.get("arguments"), str):
            try:
                fn["arguments"] = json.loads(fn["arguments"])
            except json.JSONDecodeError:
                pass
        calls.append({**c, "function": fn})
    return {**message, "content": message.get("content") or "", "tool_calls": calls}
