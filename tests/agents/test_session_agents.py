"""Agents on the real SmolLM2-135M-Instruct through the session: a two-turn tool trajectory end to end
(rollout, train, sync) on both engines, trained only on the policy's tokens, trainer and generator agreeing
on them; environments (ours and TextArena's, unchanged); bad rollouts refused with the previous one live."""

import dataclasses
import math

import pytest

from forge_nb.agents.adapters.textarena import TextArenaEnv
from forge_nb.agents.tasks.calculator import calculator, calculator_problems
from forge_nb.agents.tasks.guess_number import GuessTheNumber
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import LiveCodeError
from forge_nb.rl.losses import LOSSES
from forge_nb.session import Session
from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow

OPTIONS = dict(prompts_per_step=2, group_size=2, max_tokens=12, max_turns=3, max_total_tokens=600, threads_per_proc=1)


async def two_turns(client, row, **context):
    """The model answers; the calculator checks a sum (in the env procs); the model answers again.
    The reward differs within a group, so every trajectory trains."""
    messages = list(row["prompt"])
    first = await client.chat.completions.create(messages=messages)
    result = await context["tools"].call("calculator", {"expression": "6*7"}, "check-0")
    messages += [first.choices[0].message, {"role": "user", "content": f"The calculator says 6*7 = {result.content}."}]
    await client.chat.completions.create(messages=messages)
    return float(context["sample"])


@pytest.fixture(scope="module", params=["torch", "vllm"])
def s(request):
    session = Session.up(model="smollm2-135m-instruct", task=calculator_problems(24), engine=request.param, **OPTIONS)
    yield session
    session.down()
    assert wait_no_children() == []


def test_a_two_turn_tool_trajectory_trains_on_the_policy_tokens_only(s):
    version = s.set_rollout(two_turns, tools=[calculator])
    r = s.rollout()
    assert [e.turns and len(e.turns) for e in r.episodes] == [2, 2, 2, 2]
    for e in r.episodes:
        generated = sum(t["completion_tokens"] for t in e.turns)
        assert e.trained_tokens == generated < len(e.completion_ids)  # the second prompt's tokens are masked
        assert sum(e.completion_mask[: e.turns[0]["completion_tokens"]]) == e.turns[0]["completion_tokens"]
    assert [e.reward for e in r.episodes] == [0.0, 1.0, 0.0, 1.0] and all(e.advantage != 0 for e in r.episodes)
    before = s.trainer_version
    m = s.train(r)
    assert m["tokens"] == sum(e.trained_tokens for e in r.episodes) and m["rows_skipped"] == 0
    assert s.sync()["version"] == s.trainer_version == before + 1
    table = s.samples(4)
    assert table.turns.tolist() == [2, 2, 2, 2] and table.tool_calls.tolist() == [1, 1, 1, 1]
    assert s.versions("rollout").version.tolist()[-1] == version


def test_the_trainer_scores_the_policy_tokens_as_the_generator_sampled_them(s):
    if s.config.engine_name() == "vllm":
        pytest.skip("vLLM's CPU build runs its own kernels: compared on the torch engine")
    s.set_rollout(two_turns, tools=[calculator])
    s.sync()  # the generator serves the trainer's weights (a test before may have trained without a sync)
    r = s.rollout()
    logged = s.train(r)  # the trainer's logprobs of every completion token, before its step
    steps = s.samples(step=s.step_count)
    assert logged["rows_skipped"] == 0 and len(steps) == len(r.episodes)
    for e, row in zip(r.episodes, steps.itertuples()):
        policy = [i for i, m in enumerate(e.completion_mask) if m]
        diffs = [abs(row.trainer_logprobs[i] - e.logprobs[i]) for i in policy]
        assert max(diffs) < 1e-3


def test_every_loss_of_the_family_trains_on_the_policy_tokens_of_trajectories(s):
    if s.config.engine_name() == "vllm":
        pytest.skip("the loss runs in the trainer, the same for both engines: checked on the torch engine")
    s.set_rollout(two_turns, tools=[calculator])
    r = s.rollout()  # one batch of trajectories for every loss (each loss's ratios are then off 1 by the steps before)
    before = s.checksums("trainer")["trainer"][1]  # (the trainer's alone: the generator's is not read here)
    for name in [n for n in LOSSES if n != "aipo"]:  # (aipo: cispo's older name, the same function)
        algorithm = dataclasses.replace(s.config.algorithm, loss=name)
        s.set_loss(builtin_loss(algorithm, s.config.engine.max_tokens))
        m = s.train(r)
        assert m["tokens"] == sum(e.trained_tokens for e in r.episodes), name
        assert m["rows_skipped"] == 0 and math.isfinite(m["loss"]), name
        after = s.checksums("trainer")["trainer"][1]
        assert after != before, name  # the policy tokens moved the weights
        before = after
    s.set_loss(version=0)
    s.sync()


def test_an_async_run_trains_trajectories_within_the_staleness_bound(s):
    s.set_rollout(two_turns, tools=[calculator])
    trained_before = s.trainer_version
    run = s.run(steps=3, mode="async", max_staleness=1)
    run.wait(600)
    assert run.state == "finished", run.error
    assert run.done == 3 and max(run.staleness) <= 1
    assert s.trainer_version == trained_before + 3
    table = s.samples(4 * 3)
    assert table.turns.tolist() == [2] * 12 and (table.trained_tokens > 0).all()


def test_environments_run_ours_and_textarenas_unchanged(s):
    if s.config.engine_name() == "vllm":
        pytest.skip("the env procs drive an environment the same for both engines: checked on the torch engine")
    s.set_env(GuessTheNumber)
    r = s.rollout()
    assert all(1 <= len(e.turns) <= 3 for e in r.episodes)
    assert all(e.rewards["rollout"] == e.reward in (0.0, 1.0) for e in r.episodes)  # the game's reward, 0 too
    s.set_env(TextArenaEnv)  # the package's own GuessTheNumber, through its adapter
    r = s.rollout()
    assert all(e.turns and e.reward_error is None for e in r.episodes)
    s.train(r)
    s.sync()


def test_a_bad_rollout_is_refused_and_the_live_one_stays(s):
    if s.config.engine_name() == "vllm":
        pytest.skip("a candidate is checked in the env procs the same for both engines: checked on the torch engine")
    live = s.set_rollout(two_turns, tools=[calculator])

    async def broken(client, row, **context):
        await client.chat.completions.create(messages=list(row["prompt"]))
        raise ZeroDivisionError("on purpose")

    def not_async(client, row, **context):
        return 1.0

    async def unknown_tool(client, row, **context):
        await client.chat.completions.create(messages=list(row["prompt"]))
        return float((await context["tools"].call("search", {"query": "6*7"})).content)

    with pytest.raises(LiveCodeError, match=r"rollout v\d+ .*turn 1: ZeroDivisionError: on purpose.*stays live"):
        s.set_rollout(broken)
    with pytest.raises(LiveCodeError, match="async def rollout"):
        s.set_rollout(not_async)
    with pytest.raises(LiveCodeError, match=r"turn 1: UnknownToolError: tools.call: no tool 'search'.*stays live"):
        s.set_rollout(unknown_tool, tools=[calculator])
    assert s.registry.live("rollout").version == live
    assert s.set_rollout(version=0) == 0  # back to one completion per sample
    assert s.rollout().episodes[0].turns is None
