"""The real SmolLM2-135M-Instruct through the in-process torch engine: whatever it generates, every call
is recorded exactly (token in, token out) and the trainer can recompute its logprobs from the stream."""

import asyncio

import pytest
import torch

from forge_nb.agents.adapters.textarena import TextArenaEnv
from forge_nb.agents.backend import engine_backend
from forge_nb.agents.batching import GenerationBatcher
from forge_nb.agents.client import Limits
from forge_nb.agents.runner import run_rollouts
from forge_nb.agents.tasks import (
    GuessTheNumber,
    answer_reward,
    calculator,
    calculator_problems,
    calculator_rollout,
    guess_number_rows,
)
from forge_nb.engines.base import SamplingParams

pytestmark = pytest.mark.slow  # ~1 min on 2 shared cores: four SmolLM2 batches of up to 32 tokens

SAMPLING = SamplingParams(temperature=1.0, max_tokens=32, seed=0)


class RecordingBackend:
    """The engine's backend, remembering each prompt it was given and the completion it returned."""

    def __init__(self, engine) -> None:
        self.generate = engine_backend(engine)
        self.calls: list[tuple[list[int], list[int]]] = []  # (prompt, completion) of every call
        self.batch_sizes: list[int] = []

    def __call__(self, prompt_ids, sampling):
        out = self.generate(prompt_ids, sampling)
        self.batch_sizes.append(len(prompt_ids))
        self.calls += [(list(p), c.token_ids) for p, c in zip(prompt_ids, out)]
        return out


async def two_turns(client, row, tools, **context):
    """Always two model calls: the tool results after a tool call, else a nudge to use the tool."""
    messages = list(row["prompt"])
    first = (await client.chat.completions.create(messages=messages, tools=tools)).choices[0].message
    messages.append(first)
    if first.tool_calls:
        messages.extend(await tools.run(first.tool_calls))
    else:
        messages.append({"role": "user", "content": "Check it with the calculator tool."})
    final = (await client.chat.completions.create(messages=messages, tools=tools)).choices[0].message
    return answer_reward(final.content, row["answer"])


def check_recorded_exactly(trajectory, backend: RecordingBackend, engine) -> None:
    """Each turn is the engine's own output for the prompt it got; the trajectory is the last prompt
    plus the last output; teacher-forced logprobs of the stream equal the recorded ones."""
    ids, mask, logprobs = trajectory.token_ids(), trajectory.loss_mask(), trajectory.logprobs()
    end = 0
    for turn in trajectory.turns:
        end += len(turn.prompt_delta_ids)
        assert (ids[:end], turn.completion_ids) in backend.calls
        end += len(turn.completion_ids)
    last = trajectory.last_prompt_ids()
    assert (last, ids[len(last) :]) in backend.calls
    assert sum(mask) == sum(len(t.completion_ids) for t in trajectory.turns)
    (scored,) = engine.logprobs([trajectory.prompt_ids], [trajectory.completion_ids()])
    recorded = trajectory.completion_logprobs()
    keep = torch.tensor(trajectory.completion_mask(), dtype=torch.bool)
    assert torch.allclose(torch.tensor(scored)[keep], torch.tensor(recorded)[keep], atol=1e-4)
    assert all(lp == 0.0 for lp, m in zip(logprobs, mask) if not m)


@pytest.fixture
def backend(smollm2_engine):
    return RecordingBackend(smollm2_engine)


def test_two_turn_calculator_trajectories_on_smollm2_are_recorded_token_in_token_out(smollm2_engine, backend):
    rows = calculator_problems(1, seed=0)
    trajectories = asyncio.run(
        run_rollouts(
            GenerationBatcher(backend),
            smollm2_engine.tokenizer,
            rows,
            rollout=two_turns,
            group_size=2,
            limits=Limits(max_turns=2, max_tokens=32),
            sampling=SAMPLING,
            tools=[calculator],
        )
    )
    assert len(trajectories) == 2 and backend.batch_sizes == [2, 2]  # each turn of both in one batch
    for t in trajectories:
        assert t.finish_reason == "stop" and t.num_turns == 2, t.error
        assert t.reward in (0.0, 1.0) and t.tool_errors <= t.tool_calls
        check_recorded_exactly(t, backend, smollm2_engine)
        second_delta = smollm2_engine.tokenizer.decode(t.turns[1].prompt_delta_ids)
        assert second_delta.endswith("<|im_start|>assistant\n")
        assert "<tool_response>" in second_delta or "Check it with the calculator tool." in second_delta


def test_the_bundled_tasks_and_a_textarena_game_run_on_smollm2(smollm2_engine, backend):
    tokenizer = smollm2_engine.tokenizer
    limits = Limits(max_turns=3, max_tokens=32)
    batcher = GenerationBatcher(backend)
    calc = asyncio.run(
        run_rollouts(
            batcher,
            tokenizer,
            calculator_problems(1, seed=3),
            rollout=calculator_rollout,
            limits=limits,
            sampling=SAMPLING,
        )
    )
    guess = asyncio.run(
        run_rollouts(
            batcher,
            tokenizer,
            guess_number_rows(2),
            env=GuessTheNumber,
            limits=limits,
            sampling=SamplingParams(temperature=1.0, max_tokens=8, seed=0),
        )
    )
    arena = asyncio.run(
        run_rollouts(
            batcher,
            tokenizer,
            [{"seed": 0}],
            env=lambda: TextArenaEnv("GuessTheNumber-v0-raw"),
            limits=Limits(max_turns=2),
            sampling=SamplingParams(temperature=1.0, max_tokens=8, seed=0),
        )
    )
    for t in calc + guess + arena:
        assert t.finish_reason in ("stop", "max_turns"), t.error
        check_recorded_exactly(t, backend, smollm2_engine)
    assert all(t.reward in (0.0, 1.0) for t in calc if t.finish_reason == "stop")
    assert all(t.num_turns == 3 or t.turn_rewards[-1] == 1.0 for t in guess)
