"""TextArena's own GuessTheNumber game (PyPI `textarena`, unchanged) through the runner."""

import asyncio
import re

from forge_nb.agents.adapters.textarena import TextArenaEnv
from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import Limits
from forge_nb.agents.runner import run_rollouts
from tests.agents.conftest import ScriptedBackend


def bisect(prompt: str) -> str:
    """Binary search on TextArena's feedback ("The target number is higher." / "... lower.")."""
    low, high = 1, 20
    guesses = [int(g) for g in re.findall(r"<\|im_start\|>assistant\n\[(\d+)\]", prompt)]
    hints = re.findall(r"The target number is (higher|lower)\.", prompt)
    for guess, hint in zip(guesses, hints):
        low, high = (guess + 1, high) if hint == "higher" else (low, guess - 1)
    return f"[{(low + high) // 2}]"


def test_textarena_guess_the_number_runs_unchanged_through_the_runner(tokenizer):
    backend = ScriptedBackend(tokenizer, bisect)
    rows = [{"seed": s} for s in range(3)]
    trajectories = asyncio.run(
        run_rollouts(
            GenerationBatcher(backend),
            tokenizer,
            rows,
            env=lambda: TextArenaEnv("GuessTheNumber-v0-raw"),
            limits=Limits(max_turns=8),
        )
    )
    for t in trajectories:
        assert t.finish_reason == "stop", t.error
        assert t.turn_rewards[-1] == 1.0 and sum(t.turn_rewards[:-1]) == 0.0  # TextArena's reward for a win
        assert 1 <= t.num_turns <= 5  # bisection finds a number in 1..20 in at most 5 guesses
        assert "You are playing Guess The Number" in t.messages[0]["content"]
        if t.num_turns > 1:
            assert re.fullmatch(r"The target number is (higher|lower)\.", t.messages[2]["content"])


def test_a_textarena_invalid_move_ends_the_game_with_its_own_reward(tokenizer):
    backend = ScriptedBackend(tokenizer, lambda prompt: "I do not know")
    env = TextArenaEnv("GuessTheNumber-v0-raw")
    trajectories = asyncio.run(run_rollouts(GenerationBatcher(backend), tokenizer, [{"seed": 1}], env=lambda: env))
    (t,) = trajectories
    # TextArena allows one invalid move, then ends the game.
    assert t.finish_reason == "stop" and t.num_turns == 2 and t.turn_rewards == [0.0, 0.0]
    assert "Invalid move format" in t.messages[2]["content"] and env.game_info["invalid_move"] is True
