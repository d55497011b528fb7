"""Live reward and loss on a real local mesh: good code swaps in, bad code loses nothing."""

import re
import time

import pytest

import forge_nb
from forge_nb.live.capture import LiveCodeError
from forge_nb.session import Session
from tests.conftest import wait_no_children


@pytest.fixture(scope="module")
def s():
    session = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, timeout_s=0.5, probe_size=8)
    session.step(1)
    yield session
    session.down()
    assert wait_no_children() == []


def _actor_versions(s) -> tuple[set[int], int]:
    rewards = {v for _, v in s.fleet.rewards.version_live.call().get().items()}
    return rewards, s.checksums()["trainer"][0]


BAD_REWARDS = {
    "syntax error": ("def reward(prompt, completion, target, **context):\n    return (1.0\n", "line 2: SyntaxError"),
    "raises": (
        "def reward(prompt, completion, target, **context):\n    return 1 / 0\n",
        r"raised ZeroDivisionError: division by zero \(line 2\) on probe sample 0",
    ),
    "returns None": ("def reward(prompt, completion, target, **context):\n    pass\n", "returned NoneType None"),
    "returns str": ("def reward(prompt, completion, target, **context):\n    return 'yes'\n", "returned str 'yes'"),
    "returns list": ("def reward(prompt, completion, target, **context):\n    return [1.0]\n", "returned list"),
    "returns NaN": ("def reward(prompt, completion, target, **context):\n    return float('nan')\n", "returned nan"),
    "returns inf": ("def reward(prompt, completion, target, **context):\n    return float('inf')\n", "returned inf"),
    "hangs": (
        "import time\n\ndef reward(prompt, completion, target, **context):\n    time.sleep(3)\n    return 1.0\n",
        r"did not return within the 0.5 s timeout",
    ),
    "missing module": (
        "import no_such_module_xyz\n\ndef reward(prompt, completion, target, **context):\n    return 1.0\n",
        r"raised ModuleNotFoundError: No module named 'no_such_module_xyz'",
    ),
}

BAD_LOSSES = {
    "syntax error": ("def loss(logprobs, old_logprobs, advantages, mask)\n    return 0\n", "line 1: SyntaxError"),
    "raises": (
        "def loss(logprobs, old_logprobs, advantages, mask):\n    raise ValueError('nope')\n",
        "ValueError: nope",
    ),
    "not a scalar": (
        "def loss(logprobs, old_logprobs, advantages, mask):\n    return (logprobs * mask).sum(-1)\n",
        r"returned a tensor of shape \(\d+,\); expected a scalar",
    ),
    "without grad": (
        "def loss(logprobs, old_logprobs, advantages, mask):\n    return (old_logprobs * mask).sum()\n",
        "does not require grad",
    ),
    "NaN": (
        "def loss(logprobs, old_logprobs, advantages, mask):\n    return logprobs.sum() * float('nan')\n",
        "returned nan; expected a finite value",
    ),
    "hangs": (
        "import time\n\ndef loss(logprobs, old_logprobs, advantages, mask):\n"
        "    time.sleep(3)\n    return logprobs.sum()\n",
        r"did not return within the 0.5 s timeout",
    ),
    "missing module": (
        "from no_such_module_xyz import thing\n\ndef loss(logprobs, old_logprobs, advantages, mask):\n"
        "    return logprobs.sum()\n",
        "ModuleNotFoundError",
    ),
}


def _assert_bad_cell_loses_nothing(s, kind, source, message):
    before_versions, before_live = _actor_versions(s), s.registry.live(kind).version
    before_weights, before_samples = s.checksums(), s.state.buffer.added
    candidate = s.registry.next_version(kind)
    setter = s.set_reward if kind == "reward" else s.set_loss
    with pytest.raises(LiveCodeError) as error:
        setter(source)
    text = str(error.value)
    assert text.startswith(f"{kind} v{candidate} (cell")
    assert f"-- v{before_live} stays live" in text
    assert re.search(message, text), text
    assert s.registry.live(kind).version == before_live
    assert _actor_versions(s) == before_versions
    assert s.checksums() == before_weights
    assert s.state.buffer.added == before_samples
    assert s.versions(kind).iloc[-1]["status"] == "rejected"
    # the mesh is alive and the old version still scores / trains
    r = s.rollout()
    assert {e.reward_version for e in r.episodes} == {s.registry.live("reward").version}
    assert s.train(r)["loss_version"] == s.registry.live("loss").version
    s.sync()


@pytest.mark.parametrize("case", list(BAD_REWARDS))
def test_bad_reward_keeps_previous_version_live(s, case):
    _assert_bad_cell_loses_nothing(s, "reward", *BAD_REWARDS[case])


@pytest.mark.parametrize("case", list(BAD_LOSSES))
def test_bad_loss_keeps_previous_version_live(s, case):
    _assert_bad_cell_loses_nothing(s, "loss", *BAD_LOSSES[case])


def test_good_reward_goes_live_in_every_actor_at_the_next_batch_and_can_be_rolled_back(s):
    live = s.registry.live("reward").version
    v = s.set_reward("def reward(prompt, completion, target, **context):\n    return float(len(completion) <= 3)\n")
    assert v == s.registry.next_version("reward") - 1 and v > live
    assert _actor_versions(s)[0] == {v}
    r = s.rollout()
    assert {e.reward_version for e in r.episodes} == {v}
    assert all(e.reward == float(len(e.completion) <= 3) for e in r.episodes)
    df = r.to_pandas()
    assert {"policy_version", "reward_version", "loss_version"} <= set(df.columns)
    assert s.set_reward(version=live) == live
    assert _actor_versions(s)[0] == {live}
    assert s.versions("reward").set_index("version").loc[v, "status"] == "retired"


def test_good_loss_trains_and_is_recorded_on_every_sample(s):
    v = s.set_loss(
        "import torch\n\n"
        "def loss(logprobs, old_logprobs, advantages, mask):\n"
        "    return -(torch.exp(logprobs - old_logprobs) * advantages[:, None] * mask).sum() / mask.sum()\n"
    )
    r = s.rollout()
    metrics = s.train(r)
    assert metrics["loss_version"] == v
    assert {e.loss_version for e in r.episodes} == {v}
    s.sync()
    s.set_loss(version=0)


def test_a_loss_that_names_entropies_gets_the_policys_per_token_entropy(s):
    """The checker's probe and the trainer pass `entropies` [B, T] to a loss that names it: here the top 20% of
    tokens by entropy (top_entropy_quantile, as TRL's) keep their policy term."""
    v = s.set_loss(
        "from forge_nb.rl.losses import Modifiers, dapo_loss\n\n"
        "def loss(logprobs, old_logprobs, advantages, mask, entropies):\n"
        "    assert entropies.shape == mask.shape and bool((entropies >= 0).all()) and (entropies * mask).sum() > 0\n"
        "    kept = {'entropies': entropies, 'modifiers': Modifiers(top_entropy_quantile=0.2)}\n"
        "    return dapo_loss(logprobs, old_logprobs, advantages, mask, **kept)\n"
    )
    metrics = s.train(s.rollout())
    assert metrics["loss_version"] == v and metrics["entropy"] > 0
    s.sync()
    s.set_loss(version=0)


def test_a_validated_reward_that_fails_later_marks_the_sample_and_never_scores_it_zero(s):
    s.rollout()
    limit = s.state.next_sample_id  # probe samples have ids below this; the next rollout's are above
    v = s.set_reward(
        f"def reward(prompt, completion, target, **context):\n"
        f"    if context['sample_id'] >= {limit} and context['sample_id'] % 2:\n"
        f"        raise RuntimeError('odd sample')\n"
        f"    return 1.0\n"
    )
    errors_before = len(s.state.reward_errors)
    r = s.rollout()
    failed = [e for e in r.episodes if e.reward_error]
    assert failed and all("RuntimeError: odd sample" in e.reward_error for e in failed)
    assert all(e.reward != e.reward for e in failed)  # NaN, not 0
    assert all(e.advantage == 0.0 for e in failed)
    status = s.status()
    assert status["reward_errors"] == errors_before + len(failed)
    assert status["last_reward_errors"][-1]["reward_version"] == v
    metrics = s.train(r)  # trains on the samples that scored
    assert metrics["tokens"] == sum(e.num_tokens for e in r.episodes if not e.reward_error)
    s.sync()
    s.set_reward(version=0)


def test_rescore_compares_rewards_without_touching_the_live_one(s):
    s.rollout()
    live = s.registry.live("reward").version
    df = s.rescore(lambda prompt, completion, target, **context: 0.5, n=8)
    assert len(df) == 8 and (df.new_reward == 0.5).all()
    assert (df.delta == 0.5 - df.reward).all()
    assert s.registry.live("reward").version == live
    by_version = s.rescore(live, n=8)
    assert (by_version.new_reward == by_version.reward).all()


def test_decorator_sets_the_reward_of_the_current_session(s):
    @forge_nb.reward
    def reward(prompt, completion, target, **context):
        return 1.0 if completion.strip() == target else 0.0

    assert s.registry.live("reward").code.name == "reward"
    assert s.registry.live("reward").code.origin.startswith("test_hot_swap.py:")
    s.set_reward(version=0)


def test_a_swap_during_a_background_run_applies_at_the_next_batch_without_stopping_it(s):
    run = s.run()
    try:
        while run.done < 2:
            time.sleep(0.05)
        v = s.set_reward("def reward(prompt, completion, target, **context):\n    return 0.25\n")
        done_at_swap = run.done
        while run.done < done_at_swap + 3:
            time.sleep(0.05)
        assert run.state == "running"
    finally:
        s.stop()
    assert run.state == "finished" and run.error is None
    steps = s.state.buffer.to_pandas()
    by_group = steps.groupby("group_id").reward_version.nunique()
    assert (by_group == 1).all()  # no batch (not even a group) mixes reward versions
    after = steps[steps.reward_version == v]
    assert len(after) > 0 and (after.reward == 0.25).all()
    s.set_reward(version=0)


def test_an_exception_in_the_background_run_stops_it_and_shows_in_status(s):
    s.rollout()
    limit = s.state.next_sample_id
    s.set_reward(
        f"def reward(prompt, completion, target, **context):\n"
        f"    if context['sample_id'] >= {limit}:\n"
        f"        raise KeyError('no verifier for this prompt')\n"
        f"    return 1.0\n"
    )
    before = s.checksums()
    run = s.run()
    run.wait(60)
    status = s.status()
    assert status["run"]["state"] == "failed"
    assert "every sample of this rollout failed its reward" in status["run"]["error"]
    assert status["last_reward_errors"][-1]["error"].startswith("raised KeyError: 'no verifier for this prompt'")
    assert s.checksums() == before  # nothing was trained on
    s.set_reward(version=0)
    s.step(1)  # the session goes on after the failed run
