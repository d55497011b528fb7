"""Sessions that start and stop inside the test: process accounting needs no other mesh alive."""

import math

import pytest

from forge_nb.actors.trainer import LossFailed, LossFailedAfterSteps
from forge_nb.config import ConfigError
from forge_nb.session import Session
from tests.conftest import child_processes, wait_no_children


def test_rewards_are_sharded_over_several_reward_procs():
    s = Session.up(prompts_per_step=3, group_size=3, reward_procs=2, threads_per_proc=1)
    try:
        assert len(set(s.pids["reward"])) == 2
        r = s.rollout()
        expected = [s.state.task.verify(e.completion, e.target) for e in r.episodes]
        assert [e.reward for e in r.episodes] == expected
    finally:
        s.down()
    assert wait_no_children() == []


def test_down_leaves_no_child_process_and_is_idempotent(monkeypatch):
    monkeypatch.setenv("FORGE_NB_FORK_LINGER_S", "0")  # the default outside the suite: down stops the fork server too
    s = Session.up(prompts_per_step=2, group_size=2, threads_per_proc=1)
    pids = [p for ps in s.pids.values() for p in ps]
    assert {p.pid for p in child_processes()} >= set(pids)
    s.down()
    s.down()
    assert wait_no_children() == []
    assert not s.status()["up"]
    with pytest.raises(RuntimeError, match="session is down"):
        s.rollout()


@pytest.mark.parametrize(
    ("overrides", "message"),
    [
        ({"group_sise": 4}, "unknown config field 'group_sise'; did you mean algorithm.group_size"),
        ({"temperature": -1.0}, "engine.temperature must be >= 0.0"),
        ({"model.path": "/nonexistent/model"}, "model.path: directory '/nonexistent/model' does not exist"),
        ({"model": "smolm2"}, "'smolm2' is neither a model name"),
        ({"task": [{"question": "1+1=", "a": "2"}]}, "no prompt column 'prompt'"),
        ({"task": [{"prompt": "1+1=", "answer": 2}]}, "answers must be strings"),
        ({"task": []}, "the train data has no rows"),
        (
            {"task": [{"prompt": "1" * 80, "answer": "1"}] * 4, "eval_fraction": 0.0},
            "exceeds the model's context of 64",
        ),
    ],
)
def test_bad_config_is_one_clear_error_and_starts_nothing(overrides, message):
    with pytest.raises(ConfigError, match=message):
        Session.up(**overrides)
    assert child_processes() == []


def test_dynamic_sampling_and_overlong_penalty_shape_the_train_batch():
    s = Session.up(
        prompts_per_step=6, group_size=4, threads_per_proc=1, dynamic_sampling=True, overlong_cache=3, max_tokens=4
    )
    try:
        r = s.rollout()
        for e in r.episodes:
            assert e.rewards["reward"] + e.rewards["overlong"] == pytest.approx(e.reward)
            expected = 0.0 if e.num_tokens <= 1 else -min(1.0, (e.num_tokens - 1) / 3)
            assert e.rewards["overlong"] == pytest.approx(expected)
        by_group = {}
        for e in r.episodes:
            by_group.setdefault(e.group_id, set()).add(e.reward)
        informative = [e for e in r.episodes if len(by_group[e.group_id]) > 1]
        metrics = s.train(r)
        assert metrics["tokens"] == sum(e.num_tokens for e in informative)
    finally:
        s.down()
    assert wait_no_children() == []


def test_gspo_sapo_masked_truncated_completions_and_the_batch_std_in_a_session():
    s = Session.up(
        prompts_per_step=6, group_size=4, threads_per_proc=1, max_tokens=4,
        loss="sapo", ratio_level="sequence", off_policy_mask=0.5, mask_truncated=True, std_over="batch",
    )  # fmt: skip
    try:
        r = s.rollout()
        cut = [e.finish_reason == "length" for e in r.episodes]
        metrics = s.train(r)
        assert metrics["tokens"] == sum(e.num_tokens for e, c in zip(r.episodes, cut) if not c), cut
        assert math.isfinite(metrics["loss"]) and math.isfinite(metrics["clip_fraction"])
        rows = s.step(2)
        assert len(rows) == 2 and rows["loss"].map(math.isfinite).all()
    finally:
        s.down()
    assert wait_no_children() == []


def test_epochs_and_mini_batches_take_their_steps_and_a_loss_failing_midway_keeps_the_steps_before_it():
    """2 epochs x 2 mini-batches: four optimizer steps, one published version a batch, served whole. A loss
    that fails on the third step: the two before it are published as the batch's version, its step finishes
    (synced, its row written), then the error says so; the next batch trains as usual. In an async run the
    batch is counted as trained before the run stops."""
    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, epochs=2, mini_batches=2)
    try:
        r = s.rollout()
        metrics = s.train(r)
        assert metrics["updates"] == 4 and metrics["policy_version"] == 1
        assert metrics["tokens"] == sum(e.num_tokens for e in r.episodes)  # each sample counted once
        s.sync()
        sums = s.checksums()
        assert sums["generator"] == sums["trainer"] == (1, sums["trainer"][1])

        calls = [0]

        def third_fails(logprobs, old_logprobs, advantages, mask):
            calls[0] += 1  # (the probe ran in the checker's proc: this counts the trainer's steps)
            if calls[0] == 3:
                raise ValueError("third")
            return -((logprobs - old_logprobs).exp() * advantages[:, None] * mask).sum() / mask.sum()

        s.set_loss(third_fails)
        expected = r"failed on step 3 of the batch's 4 \(raised ValueError: third\); the 2 steps before it were taken"
        with pytest.raises(LossFailed, match=expected + " and published as policy v2"):
            s.step(1)
        assert s.step_count == 2  # the batch is recorded as trained, with its 2 steps, and its step finished:
        assert s.metrics_stream.to_pandas("train").iloc[-1]["updates"] == 2
        row = s.metrics_stream.to_pandas("step").iloc[-1]
        assert row["step"] == 2 and row["generator_version"] == 2  # synced, its row written
        sums = s.checksums()
        assert sums["generator"] == sums["trainer"] == (2, sums["trainer"][1])
        assert s.train(s.rollout())["updates"] == 4  # 4 more calls: the third was the last to fail

        def second_fails(logprobs, old_logprobs, advantages, mask):
            calls[0] += 1
            if calls[0] % 4 == 2:
                raise ValueError("second")
            return -((logprobs - old_logprobs).exp() * advantages[:, None] * mask).sum() / mask.sum()

        s.set_loss(second_fails)  # (its own copy of calls, from the kernel's: 0)
        run = s.run(steps=3, mode="async", max_staleness=1)
        run.wait(300)
        assert run.state == "failed" and "failed on step 2 of the batch's 4" in run.error
        unconsumed = sum(len(r.episodes) for r in run.unconsumed)
        assert run.trained == 16 and run.produced == run.trained + run.dropped + unconsumed  # the batch counted

        def fifth_fails(logprobs, old_logprobs, advantages, mask):
            calls[0] += 1
            if calls[0] == 5:  # the first step of the second batch
                raise ValueError("fifth")
            return -((logprobs - old_logprobs).exp() * advantages[:, None] * mask).sum() / mask.sum()

        s.set_loss(fifth_fails)
        assert s.train(s.rollout())["updates"] == 4
        before = s.checksums()["trainer"]
        with pytest.raises(LossFailed, match="raised ValueError: fifth; no step was taken") as failed:
            s.train(s.rollout())  # the user sees forge_nb's error, not Monarch's wrapper around it
        assert not isinstance(failed.value, LossFailedAfterSteps) and s.checksums()["trainer"] == before
    finally:
        s.down()
    assert wait_no_children() == []
