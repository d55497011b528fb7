"""Trajectories of agents outside the mesh, with a scripted generator: what waits, what a batch takes (complete
groups of one row, oldest first), limits and failures recorded, an agent that never called kept out of training."""

import pytest
import requests

from forge_nb.agents.client import Limits
from forge_nb.agents.external import ExternalAgents
from forge_nb.engines.base import SamplingParams
from tests.agents.conftest import ScriptedBackend

ROW = {"prompt": [{"role": "user", "content": "What is 6 times 7?"}], "answer": "42"}


@pytest.fixture
def outside(tokenizer):
    backend = ScriptedBackend(tokenizer, lambda p: "42")

    def generate(prompts, sampling):  # the generator's shape: one group of n completions per prompt, its version
        return [[c] * sampling.n for c in backend(prompts, sampling)], 3

    agents = ExternalAgents(tokenizer, generate, SamplingParams(max_tokens=8), Limits(max_turns=2))
    yield agents
    agents.stop()


def call(t, content: str = "hi") -> requests.Response:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return requests.post(f"{t.base_url}/chat/completions", json=body, headers={"Authorization": f"Bearer {t.api_key}"})


def test_a_batch_takes_complete_groups_of_one_row_oldest_first(outside):
    other = {"prompt": "Say 7.", "answer": "7"}
    for row in (ROW, other, ROW):
        with outside.trajectory(row) as t:
            assert call(t).json()["choices"][0]["message"]["content"] == "42"
    trajectories, problems = outside.take(group_size=2, groups=4)
    assert [(t.group, t.sample, t.row["answer"]) for t in trajectories] == [(0, 0, "42"), (0, 1, "42")]
    assert problems[0].target == "42" and problems[0].prompt_id.startswith("external-")
    assert trajectories[0].info["policy_versions"] == [3] and [t.row["answer"] for t in outside.pending] == ["7"]
    assert outside.take(group_size=2, groups=4) == ([], [])  # the other row's group is not complete


def test_limits_failures_and_silent_agents_are_recorded(outside):
    with outside.trajectory(ROW) as t:
        assert [call(t, str(i)).status_code for i in range(3)] == [200, 200, 400]
    with pytest.raises(ZeroDivisionError), outside.trajectory(ROW) as t:
        call(t)
        raise ZeroDivisionError("division by zero")
    with outside.trajectory(ROW):
        pass
    reasons = [(t.finish_reason, t.error) for t in outside.pending]
    assert reasons == [
        ("max_turns", None),
        ("error", "ZeroDivisionError: division by zero"),
        ("error", "the agent made no model call on its URL"),
    ]
    with pytest.raises(ValueError, match="needs a 'prompt'"), outside.trajectory({"question": "?"}):
        pass
