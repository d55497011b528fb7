"""Judge, ensemble and batched rewards on a real local mesh: the judge model runs in an actor of its
own, started when a reward first asks it (also after a resume), respawned when its proc dies without
losing a sample; nothing is left running."""

import os
import subprocess
import sys
import time
from dataclasses import dataclass

import pytest

from forge_nb.live.capture import LiveCodeError
from forge_nb.rewards import Ensemble, addition_verifiers, judge
from forge_nb.session import Session
from tests.conftest import wait_gone, wait_no_children

pytestmark = pytest.mark.slow  # SmolLM2-135M-Instruct judges


@dataclass
class JudgeStart:
    """What `set_reward(judge(...))` did on the module's session: was a judge up before, the version it
    returned, and how long it took."""

    judge_before: bool
    version: int
    live_version: int  # the live reward version right after the call
    seconds: float


@pytest.fixture(scope="module")
def started():
    """The module's one session, with the judge reward set (which starts the judge actor) before any test
    runs, so every test sees the same session whatever ran before it: the start itself is measured here
    and checked by the test that is about it."""
    # A 0.5 s reward timeout: far less than the judge takes, which must not count against it.
    session = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, timeout_s=0.5, probe_size=8)
    try:
        session.step(1)
        judge_before, start = "judge" in session.pids, time.monotonic()
        version = session.set_reward(judge(timeout_s=120), name="judge", weight=0.0)
        seconds = time.monotonic() - start
        yield session, JudgeStart(judge_before, version, session.registry.live("reward").version, seconds)
    finally:
        session.down()
    assert wait_no_children() == []


@pytest.fixture
def s(started):
    return started[0]


def test_a_batched_reward_and_the_ensemble_score_every_sample(s):
    s.set_reward(lambda completions: [float(len(c)) for c in completions], name="length", weight=0.0)
    s.set_reward(Ensemble(addition_verifiers()), name="ensemble", weight=0.0)
    try:
        s.step(1)
        episodes = s.state.buffer.recent(16)
        assert all(e.reward_error is None and 0.0 <= e.rewards["ensemble"] <= 1.0 for e in episodes)
        assert all(e.rewards["length"] == len(e.completion) for e in episodes)
    finally:
        s.remove_reward("length")
        s.remove_reward("ensemble")


def test_a_judge_reward_starts_the_judge_actor_and_its_traffic_reaches_the_metrics(started):
    s, start = started
    assert not start.judge_before
    assert start.live_version == start.version and start.seconds > 0.5
    (judge_pid,) = s.pids["judge"]
    assert judge_pid not in (*s.pids["reward"], *s.pids["live_check"], os.getpid())
    assert any(e["role"] == "judge" and "started" in e["what"] for e in s.status()["events"])
    s.step(1)
    assert all(0.0 <= e.rewards["judge"] <= 1.0 for e in s.state.buffer.recent(16))
    row = s.metrics_stream.rows("judge")[-1]
    assert row["verdicts"] == 16 and row["calls"] >= 1 and row["latency_s"] > 0 and row["verdicts_per_s"] > 0


def test_a_reward_that_spins_is_still_refused_in_time_once_judges_run(s):
    def spin(prompt, completion, target):
        while True:
            pass

    start = time.monotonic()
    with pytest.raises(LiveCodeError, match=r"did not return within the 0.5 s timeout .*was replaced"):
        s.set_reward(spin, name="spin")
    assert time.monotonic() - start < 60


def test_rescoring_with_a_judge_runs_in_the_checker(s):
    df = s.rescore(judge(template="Is {completion} the sum {question}? Answer Yes or No."), n=8)
    assert len(df) == 8 and df.new_reward.between(0, 1).all()


def test_a_resumed_session_starts_its_judge_when_the_first_batch_asks_and_loses_no_sample(s, tmp_path):
    s.save(tmp_path / "ck")
    r = Session.restore(tmp_path / "ck")
    try:
        assert "judge" not in r.pids  # nothing has asked it yet
        r.step(1)
        assert r.pids["judge"] and all(e.reward_error is None for e in r.state.buffer.recent(16))
        assert any(e["role"] == "judge" and "started" in e["what"] for e in r.status()["events"])
    finally:
        r.down()


# Runs in a child process: once this ended the controller (exit status 1, no traceback, in down() after
# the respawn; seen once in a full suite run, not reproduced since). In a child a recurrence fails this test
# with its exit status and output instead of ending the suite.
KILL_THE_JUDGE = """
import os, signal, sys
from forge_nb.rewards import judge
from forge_nb.session import Session
s = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, timeout_s=0.5, probe_size=8)
s.set_reward(judge(timeout_s=120), name="judge", weight=0.0)
s.step(1)
(old,) = s.pids["judge"]
os.kill(old, signal.SIGKILL)
s.step(1)  # the judge is respawned before the batch is scored, or the batch is scored again after
assert all(e.reward_error is None and 0.0 <= e.rewards["judge"] <= 1.0 for e in s.state.buffer.recent(16))
assert s.pids["judge"] != [old], s.pids
assert any(e["role"] == "judge" and str(old) in e["what"] for e in s.status()["events"])
pids = [pid for role in s.pids.values() for pid in role]
s.down()
print("DOWN RETURNED", *pids, flush=True)
"""


def test_a_judge_whose_proc_dies_is_respawned_and_no_sample_is_lost(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", KILL_THE_JUDGE], cwd=tmp_path, capture_output=True, text=True, timeout=500
    )
    assert out.returncode == 0 and "DOWN RETURNED" in out.stdout, (
        out.returncode,
        out.stdout[-2000:],
        out.stderr[-4000:],
    )
    # The child's procs are not this process's children: check them by pid (the module's session is still up).
    pids = [int(p) for p in out.stdout.split("DOWN RETURNED", 1)[1].split()]
    assert len(pids) >= 5 and wait_gone(pids, timeout=30) == []
