import asyncio

import pytest

from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.runner import run_rollouts
from forge_nb.agents.tasks import (
    GuessTheNumber,
    answer_reward,
    calculator,
    calculator_problems,
    calculator_rollout,
    expression_rollout,
    guess_number_rows,
)
from tests.agents.conftest import ScriptedBackend


@pytest.mark.parametrize(
    ("expression", "value"),
    [("3 * (4 + 5)", "27"), ("7 / 2", "3.5"), ("8 / 2", "4"), ("-2 ** 3", "-8"), ("17 // 5 + 17 % 5", "5")],
)
def test_calculator_evaluates_arithmetic(expression, value):
    assert calculator(expression) == value


@pytest.mark.parametrize(
    "expression",
    ["__import__('os').system('true')", "x + 1", "(1).__class__", "[1, 2]", "2 ** 1000", "1 +", "'a' * 3"],
)
def test_calculator_refuses_anything_but_arithmetic(expression):
    with pytest.raises(ValueError):
        calculator(expression)


def test_calculator_problems_offer_the_tool_and_keep_the_answers():
    rows = calculator_problems(5, seed=1)
    assert len(rows) == 5 and rows == calculator_problems(5, seed=1)
    for row in rows:
        system, user = row["prompt"]
        assert system["role"] == "system" and "calculator" in system["content"]
        assert "final number only" not in user["content"] and row["answer"].isdigit()


def test_answer_reward_reads_the_last_number():
    assert answer_reward("6 * 7 = 42", "42") == 1.0
    assert answer_reward("42 or 41", "42") == 0.0
    assert answer_reward(None, "42") == 0.0


def test_calculator_rollout_calls_the_tool_and_is_rewarded_for_the_right_answer(tokenizer):
    rows = calculator_problems(2, seed=0)

    def reply(prompt: str) -> str:
        if "<tool_response>" in prompt:
            return "The answer is " + prompt.split("<tool_response>\n")[-1].split("\n")[0]
        row = next(r for r in rows if r["prompt"][1]["content"] in prompt)
        return f'<tool_call>{{"name": "calculator", "arguments": {{"expression": "{row["answer"]} + 0"}}}}</tool_call>'

    backend = ScriptedBackend(tokenizer, reply)
    trajectories = asyncio.run(run_rollouts(GenerationBatcher(backend), tokenizer, rows, rollout=calculator_rollout))
    assert [t.reward for t in trajectories] == [1.0, 1.0]
    assert all(t.num_turns == 2 and t.tool_calls == 1 and t.tool_errors == 0 for t in trajectories)


def test_expression_rollout_runs_the_written_calculation_and_pays_the_first_turn_for_writing_one(tokenizer):
    rows = calculator_problems(3, seed=0)

    def reply(prompt: str) -> str:
        if "The calculator says" in prompt:
            return prompt.split(" = ")[-1].split(".")[0]  # copies the result
        row = next(r for r in rows if r["prompt"][1]["content"] in prompt)
        return {0: f"It is {row['answer']} + 0 = {row['answer']}", 1: f"{row['answer']} + 1", 2: "no idea"}[
            rows.index(row)
        ]

    backend = ScriptedBackend(tokenizer, reply)
    trajectories = asyncio.run(run_rollouts(GenerationBatcher(backend), tokenizer, rows, rollout=expression_rollout))
    assert [t.num_turns for t in trajectories] == [2, 2, 1]
    assert [t.tool_calls for t in trajectories] == [1, 1, 0]
    assert [t.turns[0].reward for t in trajectories] == [0.2, 0.2, 0.0]
    assert [t.reward for t in trajectories] == [1.0, 0.0, 0.0]
    assert [t.total_reward for t in trajectories] == [1.2, 0.2, 0.0]  # what it trains on


def test_guess_the_number_says_higher_lower_and_rewards_the_right_guess():
    env = GuessTheNumber(1, 20)
    assert "between 1 and 20" in env.reset({"target": 9})
    assert env.step("I think 4") == ("Higher.", 0.0, False)
    assert env.step("15") == ("Lower.", 0.0, False)
    assert env.step("no idea")[1:] == (0.0, False)
    assert env.step("9") == ("Correct! The number was 9.", 1.0, True)
    rows = guess_number_rows(4, seed=2)
    assert rows == guess_number_rows(4, seed=2) and all(1 <= r["target"] <= 20 for r in rows)
