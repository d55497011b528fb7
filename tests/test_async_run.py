"""Async mode on a real mesh: overlap, the staleness bound, and exact sample accounting."""

import time

import pytest

from forge_nb.session import Session
from tests.conftest import wait_no_children


@pytest.fixture(scope="module")
def s():
    session = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, loss="aipo")
    yield session
    session.down()
    assert wait_no_children() == []


def _check_accounting(s, run, added_before):
    unconsumed = [e.sample_id for r in run.unconsumed for e in r.episodes]
    assert run.produced == run.trained + run.dropped + len(unconsumed)
    assert len(run.trained_sample_ids) == len(set(run.trained_sample_ids))  # none used twice
    assert not set(run.trained_sample_ids) & set(unconsumed)
    assert s.state.buffer.added - added_before == run.produced  # none lost: every sample is in the buffer


@pytest.mark.parametrize("max_staleness", [1, 0])
def test_async_run_honours_the_staleness_bound_and_loses_no_sample(s, max_staleness):
    added_before, generator_before = s.state.buffer.added, s.generator_version
    run = s.run(steps=6, mode="async", max_staleness=max_staleness)
    run.wait(180)
    assert run.state == "finished", run.error
    assert run.done == 6
    assert max(run.staleness) <= max_staleness
    assert s.generator_version > generator_before  # refreshed during the run, between generator batches
    _check_accounting(s, run, added_before)
    assert s.staleness().sum() >= 6  # the histogram of trained batches by staleness
    sums = s.checksums()
    assert sums["trainer"][0] == s.trainer_version


def test_stop_mid_run_keeps_queued_batches_as_unconsumed(s):
    added_before = s.state.buffer.added
    run = s.run(mode="async", max_staleness=2)
    while run.done < 2 and run.state == "running":
        time.sleep(0.05)
    run.stop()
    assert run.state == "finished", run.error
    _check_accounting(s, run, added_before)
