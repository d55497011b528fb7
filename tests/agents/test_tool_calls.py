import asyncio
import copy
import json

from forge_nb.agents.tool_calls import parse_tool_calls, render, template_renders_tools
from forge_nb.agents.tools import ToolSet, tool_schema


def calculator(expression: str) -> str:
    """Evaluate arithmetic.

    Args:
        expression: The expression.
    """
    return "12"


# A Qwen2.5-style template that writes tools and tool calls (SmolLM2's ignores them).
TOOL_TEMPLATE = (
    "{% if tools %}<|im_start|>system\n<tools>{% for t in tools %}{{ t | tojson }}\n{% endfor %}</tools><|im_end|>\n"
    "{% endif %}{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}"
    "{% if m.tool_calls %}{% for c in m.tool_calls %}<tool_call>{{ c.function | tojson }}</tool_call>{% endfor %}"
    "{% endif %}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_parses_hermes_tool_calls_tolerant_of_whitespace():
    text = (
        'Let me compute.\n<tool_call>\n  {"name": "calculator",\n "arguments": {"expression": "3*4"}}  \n</tool_call>'
        '<tool_call>{"name":"calculator","arguments":{"expression":"1+1"}}</tool_call>'
    )
    parsed = parse_tool_calls(text)
    assert parsed.content == "Let me compute."
    assert [c["function"]["name"] for c in parsed.tool_calls] == ["calculator", "calculator"]
    assert json.loads(parsed.tool_calls[0]["function"]["arguments"]) == {"expression": "3*4"}
    assert parsed.tool_calls[1] == {
        "id": "call_1",
        "type": "function",
        "function": {"name": "calculator", "arguments": '{"expression": "1+1"}'},
    }


def test_text_without_tool_calls_is_all_content():
    parsed = parse_tool_calls("The answer is 12.")
    assert parsed.content == "The answer is 12." and parsed.tool_calls == []


def test_a_malformed_tool_call_becomes_a_parse_error_the_model_sees():
    parsed = parse_tool_calls('<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"</tool_call>')
    assert parsed.content is None
    (call,) = parsed.tool_calls
    assert call["function"]["name"] == "calculator"
    (message,) = asyncio.run(ToolSet([calculator]).run(parsed.tool_calls))
    assert message["role"] == "tool"
    assert message["content"].startswith("Error: the arguments of calculator are not valid JSON")


def test_an_unclosed_tool_call_at_the_end_of_a_cut_completion_is_still_parsed():
    parsed = parse_tool_calls('ok <tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}')
    assert parsed.content == "ok" and parsed.tool_calls[0]["function"]["name"] == "calculator"


def test_smollm2_template_ignores_tools_so_they_go_into_a_hermes_system_block(tokenizer):
    assert not template_renders_tools(tokenizer)
    schema = tool_schema(calculator)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 3*4?"},
        {"role": "assistant", "content": None, "tool_calls": [parse_tool_calls(_CALL).tool_calls[0]]},
        {"role": "tool", "tool_call_id": "call_0", "content": "12"},
    ]
    text = render(tokenizer, messages, [schema])
    assert text.startswith("<|im_start|>system\nBe brief.\n\nYou may call one or more functions")
    assert f"<tools>\n{json.dumps(schema)}\n</tools>" in text
    assert '<|im_start|>assistant\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "3*4"}}' in text
    assert "<|im_start|>user\n<tool_response>\n12\n</tool_response><|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n")


_CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "3*4"}}</tool_call>'


def test_a_template_that_renders_tools_gets_them_natively(tokenizer):
    native = copy.copy(tokenizer)
    native.chat_template = TOOL_TEMPLATE
    assert template_renders_tools(native)
    text = render(native, [{"role": "user", "content": "3*4?"}], [tool_schema(calculator)])
    assert text.startswith('<|im_start|>system\n<tools>{"type": "function"')
    assert "You may call one or more functions" not in text  # no fallback block
