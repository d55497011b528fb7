"""Bundled agent task: arithmetic word problems solved with a calculator tool.

Rows come from `forge_nb.tasks.word_problems` (seeded, answers are integers) with a system prompt that
offers the tool; `calculator_rollout` is the agent loop (call the model with the tool, run its tool
calls, repeat until it answers); the reward is 1.0 when the last number of its answer is the target.
`expression_rollout` is a fixed two-turn agent for models that do not write tool calls yet (SmolLM2-135M
never does): the model writes the calculation, the loop runs it on the calculator, the model answers.
`calculator` evaluates arithmetic by walking the expression's syntax tree: numbers, + - * / // % **
and parentheses only; nothing is ever `eval`-ed.
"""

from __future__ import annotations

import ast
import operator
import re
from typing import Any

from forge_nb.agents.tools import ToolSet
from forge_nb.tasks.word_problems import INSTRUCTION, word_problems

SYSTEM_PROMPT = (
    "Solve the word problem. Use the calculator tool for the arithmetic. "
    "When you know the answer, reply with the final number only."
)
EXPRESSION_PROMPT = "Write the calculation that answers the question, for example 6 * 8."
ANSWER_PROMPT = "The calculator says {expression} = {result}. Reply with the final number only."
EXPRESSION_BONUS = 0.2  # the first turn's reward for writing a calculation the tool can run
EXPRESSION = re.compile(r"\d+(?:\s*[-+*/]\s*\d+)+")
MAX_EXPRESSION_CHARS = 200
MAX_EXPONENT = 64
MAX_MAGNITUDE = 10**30
NUMBER = re.compile(r"-?\d+(?:\.\d+)?")

_BINARY = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression with + - * / // % ** and parentheses.

    Args:
        expression: The arithmetic expression to evaluate, for example "12 * (3 + 4)".
    """
    if len(expression) > MAX_EXPRESSION_CHARS:
        raise ValueError(f"the expression is longer than {MAX_EXPRESSION_CHARS} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {expression!r}") from e
    value = _evaluate(tree.body)
    if isinstance(value, float) and value.is_integer():
        value = int(value)
    return str(round(value, 6) if isinstance(value, float) else value)


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and abs(right) > MAX_EXPONENT:
            raise ValueError(f"exponent {right} is larger than {MAX_EXPONENT}")
        value = _BINARY[type(node.op)](left, right)
        if abs(value) > MAX_MAGNITUDE:
            raise ValueError("the result is too large")
        return value
    raise ValueError(f"only numbers, + - * / // % ** and parentheses are allowed, not {type(node).__name__}")


def calculator_problems(n: int, seed: int = 0, top: int = 40) -> list[dict]:
    """`n` word problems as agent rows: ``{"prompt": [system, user], "answer": "42", "kind": ...}``."""
    rows = []
    for row in word_problems(n, seed=seed, top=top):
        question = row["prompt"][0]["content"].removesuffix(INSTRUCTION).strip()
        prompt = [{"role": "system", "content": SYSTEM_PROMPT}, {"role": "user", "content": question}]
        rows.append({**row, "prompt": prompt})
    return rows


def answer_reward(answer: str | None, target: str) -> float:
    """1.0 when the last number in `answer` equals `target` (an integer), else 0.0."""
    numbers = NUMBER.findall(answer or "")
    if not numbers:
        return 0.0
    return 1.0 if float(numbers[-1]) == float(target) else 0.0


async def calculator_rollout(client, row: dict, **context: Any) -> float:
    """The agent loop: the model answers or calls the calculator; tool results go back to it until it
    answers (the runner's `Limits` end a loop that never does). -> `answer_reward` of the answer."""
    tools = _calculator_tools(context)
    messages: list[Any] = list(row["prompt"])
    while True:
        response = await client.chat.completions.create(messages=messages, tools=tools)
        message = response.choices[0].message
        messages.append(message)
        if not message.tool_calls:
            return answer_reward(message.content, row["answer"])
        messages.extend(await tools.run(message.tool_calls))


async def expression_rollout(client, row: dict, **context: Any) -> float:
    """Two turns: the model writes the calculation (`EXPRESSION_PROMPT`), the loop runs the first one it
    finds on the calculator (in the env procs, counted as a tool call), the model answers from the result.
    -> `answer_reward` of the answer; the first turn earns `EXPRESSION_BONUS` (a per-turn reward) when it
    holds a calculation, and a reply with none ends the trajectory with reward 0."""
    tools, trajectory = _calculator_tools(context), context["trajectory"]
    messages: list[Any] = [{"role": "system", "content": EXPRESSION_PROMPT}, row["prompt"][-1]]
    reply = (await client.chat.completions.create(messages=messages)).choices[0].message
    found = EXPRESSION.search(reply.content or "")
    if found is None:
        return 0.0
    trajectory.add_reward(EXPRESSION_BONUS)
    result = await tools.call("calculator", {"expression": found.group()}, "calculation")
    answer = ANSWER_PROMPT.format(expression=found.group(), result=result.content)
    messages += [reply, {"role": "user", "content": answer}]
    reply = (await client.chat.completions.create(messages=messages)).choices[0].message
    return answer_reward(reply.content, row["answer"])


def _calculator_tools(context: dict) -> ToolSet:
    """The session's tools when they hold the calculator, else a set of its own (counted on the trajectory)."""
    tools = context.get("tools")
    if isinstance(tools, ToolSet) and "calculator" in tools.functions:
        return tools
    trajectory = context.get("trajectory")
    return ToolSet([calculator], on_result=trajectory.record_tool if trajectory is not None else None)
