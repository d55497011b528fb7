"""The OpenAI-compatible endpoint through the session, on the real SmolLM2-135M-Instruct: agents written
with the OpenAI Agents SDK and with smolagents train unchanged (rollout, train, sync; trained tokens =
the policy's generated tokens); agents that change their tools or drop earlier messages train in
segments; an agent in another process that speaks only `requests` contributes trajectories; requests
without the token are refused; no port stays open after `down()`."""

import json
import socket
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlparse

import pytest
import requests

from forge_nb.agents.tasks.calculator import calculator_problems
from forge_nb.notebook.magics import ForgeMagics
from forge_nb.runtime.calls import wait
from forge_nb.session import Session
from tests.agents.frameworks.sdk_agent import sdk_rollout
from tests.agents.frameworks.smol_agent import smol_rollout
from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow

OPTIONS = dict(prompts_per_step=2, group_size=2, max_tokens=16, max_turns=3, max_total_tokens=4000, threads_per_proc=1)
AGENT = Path(__file__).parent / "frameworks" / "requests_agent.py"
PORTS: list[int] = []  # every port an endpoint of the session served on (checked closed after down)


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


async def tools_then_none(client, row, **context):
    """A first call with a tool, a second without (what agents that force a final answer do)."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(messages=messages, tools=[multiply])
    messages += [first.choices[0].message, {"role": "user", "content": "Now answer with the number only."}]
    await client.chat.completions.create(messages=messages)
    return float(context["sample"])


async def drops_history(client, row, **context):
    """A second call that keeps only the last user message (what trimming agents do)."""
    first = await client.chat.completions.create(messages=list(row["prompt"]))
    summary = f"Earlier you said: {first.choices[0].message.content}. Give the final number."
    await client.chat.completions.create(messages=[{"role": "user", "content": summary}])
    return float(context["sample"])


@pytest.fixture(scope="module")
def s():
    session = Session.up(model="smollm2-135m-instruct", task=calculator_problems(24), engine="torch", **OPTIONS)
    yield session
    session.down()
    assert wait_no_children() == []
    for port in PORTS:
        with socket.socket() as probe:
            assert probe.connect_ex(("127.0.0.1", port)) != 0, f"port {port} is still open after down()"


def env_ports(s) -> list[int]:
    urls = wait(s.fleet.envs.actors.endpoint_url.call()).values()
    return [urlparse(url).port for url in urls if url]


def trains_on_the_policy_tokens(s, r, every_row: bool = True) -> dict:
    """Train and sync on `r`: the trained tokens are the policy's generated tokens (and with `every_row`,
    whose rewards differ within each group, no row is skipped for a zero advantage)."""
    for e in r.episodes:
        assert e.trained_tokens == sum(t["completion_tokens"] for t in e.turns) > 0
    before = s.trainer_version
    m = s.train(r)
    assert m["tokens"] == sum(e.trained_tokens for e in r.episodes) and (m["rows_skipped"] == 0 or not every_row)
    assert s.sync()["version"] == s.trainer_version == before + 1
    return m


@pytest.mark.parametrize("rollout", [sdk_rollout, smol_rollout], ids=["openai-agents", "smolagents"])
def test_an_agent_written_with_a_framework_trains_unchanged(s, rollout):
    s.set_rollout(rollout)
    r = s.rollout()
    assert [e.finish_reason for e in r.episodes if e.segment == e.segments - 1].count("error") == 0, r.episodes
    trains_on_the_policy_tokens(s, r, every_row=False)  # the task's reward: often 0 for the whole group
    PORTS.extend(env_ports(s))


@pytest.mark.parametrize("rollout", [tools_then_none, drops_history], ids=["tools-changed", "history-dropped"])
def test_calls_that_do_not_extend_the_conversation_train_as_segments(s, rollout):
    s.set_rollout(rollout)
    r = s.rollout()
    assert [(e.segment, e.segments) for e in r.episodes] == [(0, 2), (1, 2)] * 4
    for first, second in zip(r.episodes[::2], r.episodes[1::2]):
        assert second.turns[0]["new_segment"] and first.advantage == second.advantage != 0
        assert first.completion_mask == [1] * len(first.completion_ids)  # one turn: every token the policy's
        assert second.prompt_ids != first.prompt_ids
    trains_on_the_policy_tokens(s, r)
    assert s.samples(8).segment.tolist() == ["1/2", "2/2"] * 4


def test_an_agent_in_another_process_contributes_trajectories(s):
    endpoint = s.endpoint()
    PORTS.append(urlparse(endpoint.url).port)
    assert ForgeMagics(None)._endpoint("")["url"] == endpoint.url  # %forge endpoint
    row = {"prompt": [{"role": "user", "content": "What is 6 times 7?"}], "answer": "42"}
    for reward in (0.0, 1.0):
        with s.trajectory(row) as t:
            out = subprocess.run(
                [sys.executable, str(AGENT), t.base_url, t.api_key, "What is 6 times 7?"],
                capture_output=True,
                text=True,
                timeout=300,
                check=True,
            )
            assert len(json.loads(out.stdout)) == 2
            refused = requests.get(f"{t.base_url}/models", timeout=10)  # no token
            assert refused.status_code == 401 and refused.json()["error"]["type"] == "authentication_error"
            t.reward(reward)
        closed = requests.get(f"{t.base_url}/models", headers={"Authorization": f"Bearer {t.api_key}"}, timeout=10)
        assert closed.status_code == 404
    r = s.rollout()  # the waiting group is this batch
    assert [e.reward for e in r.episodes] == [0.0, 1.0] and [len(e.turns) for e in r.episodes] == [2, 2]
    assert r.episodes[0].prompt_id == r.episodes[1].prompt_id and not s.endpoint().pending
    trains_on_the_policy_tokens(s, r)
