"""Supervision on a real mesh: procs killed mid-run are respawned and no sample is lost or trained twice;
a killed controller takes its mesh with it."""

import os
import signal
import subprocess
import sys
import textwrap
import time

import psutil
import pytest

from forge_nb.session import Session
from tests.conftest import wait_gone, wait_no_children

P, G = 4, 4


def _wait_until(predicate, timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.05)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_killing_a_generator_and_a_reward_proc_mid_run_loses_and_duplicates_no_sample(mode):
    s = Session.up(prompts_per_step=P, group_size=G, threads_per_proc=1, loss="aipo")
    try:
        run = s.run(steps=8, mode=mode)
        _wait_until(lambda: run.done >= 2)
        generator = s.pids["generator"]
        os.kill(generator[0], signal.SIGKILL)
        _wait_until(lambda: run.done >= 4)
        reward = s.pids["reward"]
        os.kill(reward[0], signal.SIGKILL)
        run.wait(300)
        assert run.state == "finished", run.error
        assert run.done == 8 and s.step_count == 8
        ids = [e.sample_id for e in s.state.buffer.recent(10_000)]
        assert len(ids) == len(set(ids)), "a sample was added twice"
        assert sorted(ids) == list(range(len(ids))), "a sample id is missing"
        if mode == "sync":
            assert len(ids) == 8 * P * G  # every step trained the rollout it made
        else:  # produced = trained + dropped + still queued, each sample once
            trained = run.trained_sample_ids
            unconsumed = [e.sample_id for r in run.unconsumed for e in r.episodes]
            assert len(trained) == len(set(trained)) and run.produced == run.trained + run.dropped + len(unconsumed)
            assert run.produced == len(ids)
        events = s.status()["events"]
        assert any(e["role"] == "generator" and "respawned" in e["what"] for e in events), events
        assert any(e["role"] == "reward" and "respawned" in e["what"] for e in events), events
        assert s.pids["generator"] != generator and s.pids["reward"] != reward
        sums = s.checksums()
        s.sync()
        assert s.checksums()["generator"] == s.checksums()["trainer"]  # the new generator follows the trainer
        assert sums["trainer"][0] == s.trainer_version
    finally:
        s.down()
    assert wait_no_children() == []


SCRIPT = textwrap.dedent("""
    import time
    from forge_nb.session import Session

    if __name__ == "__main__":
        s = Session.up(prompts_per_step=2, group_size=2, threads_per_proc=1)  # the controller in this process
        print(" ".join(str(p) for ps in s.pids.values() for p in ps), flush=True)
        time.sleep(600)
""")


def test_a_killed_controller_takes_its_mesh_with_it(tmp_path):
    script = tmp_path / "controller.py"
    script.write_text(SCRIPT)
    controller = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in controller.stdout.readline().split()]
        assert len(pids) >= 4 and all(psutil.pid_exists(p) for p in pids)
    finally:
        controller.send_signal(signal.SIGKILL)
        controller.wait(10)
    assert wait_gone(pids, timeout=10) == []
