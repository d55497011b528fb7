"""The rollout log: Parquet files a reader can open at any time, bounded by size; on a real mesh, every
trained sample of a background run exactly once, readable while it runs."""

import time

import pandas as pd
import pytest

from forge_nb.rl.episode import Episode
from forge_nb.run.rollout_log import Batch, RolloutLog
from forge_nb.session import Session
from tests.conftest import wait_no_children


def _episodes(first_id: int, n: int, tokens: int = 4) -> list[Episode]:
    return [
        Episode(
            sample_id=first_id + i,
            group_id=i // 2,
            prompt_id=f"p{i // 2}",
            prompt="1+1=",
            completion="2",
            target="2",
            prompt_ids=[1, 2],
            completion_ids=list(range(tokens)),
            logprobs=[-0.5] * tokens,
            finish_reason="stop",
            policy_version=0,
            reward=1.0,
            rewards={"reward": 1.0, "bonus": 0.5},
            extras={"level": 3},
        )
        for i in range(n)
    ]


def test_batches_are_read_back_by_step_and_prompt(tmp_path):
    log = RolloutLog(tmp_path / "log")
    eps = _episodes(0, 4)
    log.append(Batch(eps, 1, 0, frozenset({0, 1}), {0: [-0.4] * 4, 1: [-0.6] * 4}))
    log.append(Batch(_episodes(4, 4), 2, 1, frozenset(), {}, dropped=True))
    log.append(Batch(_episodes(8, 4), 2, 0, frozenset(range(8, 12)), {}))
    one = log.read(step=1)
    assert list(one.sample_id) == [0, 1, 2, 3] and list(one.trained) == [True, True, False, False]
    assert list(one.trainer_logprobs[0]) == [-0.4] * 4 and one.trainer_logprobs[2] is None
    assert list(one["reward/bonus"]) == [0.5] * 4 and one.extras[0] == '{"level": 3}'
    everything = log.read()
    assert len(everything) == 12 and everything.sample_id.is_unique
    assert set(everything[everything.trained].sample_id) == {0, 1, 8, 9, 10, 11}
    assert list(log.read(prompt_id="p1").sample_id) == [2, 3, 6, 7, 10, 11]
    assert len(log.read(trained=False)) == 6  # two untrained + the dropped batch
    log.close()
    assert len(pd.read_parquet(tmp_path / "log")) == 12  # plain pandas reads the folder too


def test_oldest_files_go_past_the_size_bound(tmp_path):
    log = RolloutLog(tmp_path / "log", max_mb=0.05)
    for step in range(1, 41):
        log.append(Batch(_episodes(step * 100, 8, tokens=200), step, 0, frozenset(), {}))
    log.flush()
    kept = sorted(int(p.stem.split("-")[1]) for p in log.files())
    assert 1 <= len(kept) < 40 and kept[-1] == 40 and kept == list(range(kept[0], 41))
    assert sum(p.stat().st_size for p in log.files()) <= 0.05 * (1 << 20) + max(p.stat().st_size for p in log.files())
    log.close()


def test_no_reader_sees_a_half_written_file(tmp_path):
    log = RolloutLog(tmp_path / "log")
    for step in range(1, 30):
        log.append(Batch(_episodes(step * 10, 8, tokens=64), step, 0, frozenset(), {}))
        frame = pd.concat([pd.read_parquet(p) for p in log.files()]) if log.files() else None  # never raises
        assert frame is None or len(frame) % 8 == 0
    log.close()
    assert not list((tmp_path / "log").glob(".*partial"))


@pytest.mark.slow
def test_a_background_run_logs_every_trained_sample_once_readable_while_it_runs():
    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1)
    try:
        s.run(steps=12)
        seen_during = []
        while s.background.state == "running":
            seen_during.append(len(s.state.rollout_log.read()))
            time.sleep(0.2)
        s.background.wait()
        log = s.state.rollout_log.read()
        train = s.metrics_stream.to_pandas("train").set_index("step")
        assert any(0 < n < len(log) for n in seen_during)  # read while it ran, partly written
        trained = log[log.trained]
        assert trained.sample_id.is_unique and log.sample_id.is_unique
        assert sorted(trained.step.unique()) == list(range(1, 13)) == sorted(train.index)
        assert (trained.groupby("step").size() == 16).all()  # every sample of every batch was trained
        assert trained.trainer_logprobs.map(len).eq(trained.num_tokens).all()
        pairs = zip(trained.trainer_logprobs, trained.logprobs)
        gap = max(abs(t - g) for ts, gs in pairs for t, g in zip(ts, gs))
        assert gap < 1e-3  # synchronous: trainer and generator held the same weights
        last = s.samples(step=12)
        assert len(last) == 16 and (last.policy_version == 11).all() and (last.staleness == 0).all()
    finally:
        s.down()
    assert wait_no_children() == []


@pytest.mark.slow
def test_async_batches_dropped_as_stale_are_logged_untrained():
    s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1)
    try:
        run = s.run(steps=8, mode="async", max_staleness=0)
        run.wait(300)
        log = s.state.rollout_log.read()
        assert log[log.trained].sample_id.is_unique
        assert log.trained.sum() == 8 * 16
        assert (~log.trained).sum() == run.dropped and (log[~log.trained].staleness > 0).all()
        assert (log[log.trained].staleness == 0).all()
    finally:
        s.down()
    assert wait_no_children() == []
