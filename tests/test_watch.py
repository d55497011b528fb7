"""Watches: each condition on crafted batches, then on crafted runs of a real mesh, where it must pause
the run at the first step it holds (no step trained after it), with the actors warm."""

import math
import time

import pytest

from forge_nb.rl.episode import Episode
from forge_nb.rl.rollout import Rollout
from forge_nb.watch import StepView, Watch


def _view(step: int, rewards: list[list[float]], tokens: int = 3, train: dict | None = None, **members) -> StepView:
    episodes = [
        Episode(
            sample_id=g * 10 + i,
            group_id=g,
            prompt_id=f"p{g}",
            prompt="q",
            completion="a",
            target="a",
            prompt_ids=[1],
            completion_ids=[5] * tokens,
            logprobs=[-0.1] * tokens,
            finish_reason="stop",
            policy_version=0,
            reward=r,
            rewards={"reward": r, **{name: values[g][i] for name, values in members.items()}},
        )
        for g, group in enumerate(rewards)
        for i, r in enumerate(group)
    ]
    weights = {"reward": 1.0, **dict.fromkeys(members, 1.0)}
    return StepView({"step": step, "mean_reward": 0.5}, Rollout(episodes, 0, 0.5, 1.0, 0.1), train or {}, weights)


def test_all_equal_groups_counts_groups_without_signal():
    w = Watch({"all_equal_groups": 0.5})
    assert w.check(_view(1, [[0, 1], [1, 1], [0, 1]])) is None  # 1 of 3
    fired = w.check(_view(2, [[0, 0], [1, 1], [0, 1]]))  # 2 of 3
    assert fired.condition == "all_equal_groups" and fired.step == 2 and "67%" in fired.message
    assert len(fired.batch) == 6 and w.fired == [fired]


def test_reward_dominance_weighs_the_members():
    w = Watch({"reward_dominance": 0.8})
    assert w.check(_view(1, [[1, 0]])) is None  # one member: nothing to dominate
    balanced = _view(1, [[1, 0]], bonus=[[0.5, 0.5]])
    assert w.check(balanced) is None
    fired = w.check(_view(2, [[0, 0.1]], bonus=[[1, 1]]))
    assert fired.condition == "reward_dominance" and "'bonus'" in fired.message


def test_length_drift_against_the_first_steps():
    w = Watch({"length_drift": 0.5}, baseline_steps=2)
    for step in (1, 2, 3):
        assert w.check(_view(step, [[1, 0]], tokens=10)) is None
    assert w.check(_view(4, [[1, 0]], tokens=14)) is None  # +40%
    assert w.check(_view(5, [[1, 0]], tokens=4)).condition == "length_drift"  # -60%


def test_kl_and_grad_norm_and_predicate():
    assert Watch({"kl_spike": 0.1}).check(_view(1, [[1, 0]], train={"approx_kl": 0.05})) is None
    assert Watch({"kl_spike": 0.1}).check(_view(1, [[1, 0]], train={"approx_kl": 0.2})).condition == "kl_spike"
    assert Watch({"grad_norm": 10}).check(_view(1, [[1, 0]], train={"grad_norm": 3.0})) is None
    nan = Watch({"grad_norm": 10}).check(_view(1, [[1, 0]], train={"grad_norm": math.nan}))
    assert nan.condition == "grad_norm" and "nan" in nan.message
    w = Watch({}, when=lambda row: row["step"] == 2)
    assert w.check(_view(1, [[1, 0]])) is None
    assert w.check(_view(2, [[1, 0]])).condition == "when"


def test_unknown_condition_is_named(session):
    from forge_nb.session import SessionError

    with pytest.raises(SessionError, match="no watch condition 'kl'.*all_equal_groups"):
        session.watch(kl=0.1)


# --- crafted runs on a real mesh: every test leaves the session as it found it -------------------------


def constant(prompt, completion, target, **context):
    return 1.0


@pytest.fixture
def s(session):
    engine = (session.config.engine.max_tokens, session.config.engine.temperature)
    yield session
    session.unwatch()
    session.stop()
    session.set_reward(version=0)
    for name in list(session.registry.live("reward").members):
        if name != "reward":
            session.remove_reward(name)
    session.config.engine.max_tokens, session.config.engine.temperature = engine


def _steps_then(s, before: int, change, watch: dict, n: int = 6):
    """`before` steps unwatched, then `change()`, then a watched `s.step(n)` -> (rows, the step it fired)."""
    s.step(before, progress=False)
    start = s.step_count
    w = s.watch(**watch)
    change()
    rows = s.step(n, progress=False)
    assert w.fired, f"{watch} never fired in {n} steps"
    fired = w.fired[-1]
    assert list(rows.index)[-1] == fired.step == s.step_count  # s.step stopped right at it
    return start, fired


def test_all_equal_groups_fires_when_the_reward_stops_discriminating(s):
    start, fired = _steps_then(s, 1, lambda: s.set_reward(constant), {"all_equal_groups": 0.99})
    assert fired.step == start + 1 and fired.condition == "all_equal_groups"
    assert fired.batch.reward.eq(1.0).all()


def test_reward_dominance_fires_when_a_member_takes_over(s):
    change = lambda: s.set_reward(constant, name="bonus", weight=20.0)  # noqa: E731
    start, fired = _steps_then(s, 1, change, {"reward_dominance": 0.9})
    assert fired.step == start + 1 and "'bonus'" in fired.message


def test_length_drift_fires_when_completions_shrink(s):
    w = s.watch(length_drift=0.3, baseline_steps=2)
    s.step(2, progress=False)
    assert not w.fired
    start = s.step_count
    s.config.engine.max_tokens = 1  # every completion is cut to one token from the next rollout on
    rows = s.step(5, progress=False)
    assert w.fired[-1].step == start + 1 == rows.index[-1] and w.fired[-1].condition == "length_drift"


def test_kl_spike_fires_when_the_generator_samples_another_distribution(s):
    # The trainer scores tokens at the temperature it was started with; a generator sampling hotter
    # gives logprobs of another distribution: exactly the mismatch this watch is for.
    # A batch whose groups all agree trains nothing (KL 0 by definition): it fires at the first that trains.
    change = lambda: setattr(s.config.engine, "temperature", 3.0)  # noqa: E731
    start, fired = _steps_then(s, 1, change, {"kl_spike": 0.05}, n=10)
    kl = s.metrics_stream.to_pandas("train").set_index("step").approx_kl
    assert fired.condition == "kl_spike" and kl[fired.step] > 0.05
    assert (kl[(kl.index > start) & (kl.index < fired.step)] <= 0.05).all()


def test_grad_norm_fires_at_the_first_step_with_a_gradient(s):
    def first_with_gradient():
        s.set_reward(version=0)  # back to the verifier: groups disagree, gradients flow

    s.set_reward(constant)  # zero advantages: zero gradients
    start, fired = _steps_then(s, 1, first_with_gradient, {"grad_norm": 1e-6})
    norms = s.metrics_stream.to_pandas("train").set_index("step").grad_norm
    assert norms[start] == 0.0  # the last unwatched step had no gradient
    assert fired.condition == "grad_norm" and norms[fired.step] > 1e-6
    assert (norms[(norms.index > start) & (norms.index < fired.step)] <= 1e-6).all()


def test_a_predicate_pauses_a_background_run_at_its_step_with_the_actors_warm(s):
    target = s.step_count + 3
    w = s.watch(when=lambda row: row["step"] == target)
    run = s.run()
    deadline = time.monotonic() + 120
    while not w.fired and time.monotonic() < deadline:
        time.sleep(0.1)
    assert w.fired and w.fired[0].step == target
    time.sleep(1.0)  # a paused run trains nothing more
    assert run.state == "paused" and s.step_count == target
    s.unwatch()
    s.resume()  # actors warm: it goes on from there
    while s.step_count < target + 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    s.stop()
    assert s.step_count >= target + 2 and run.error is None
