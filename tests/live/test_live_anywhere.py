"""Live code from anywhere: a plain script, a cell that also starts the session, helpers and constants
beside the reward, an importable module, a stateful reward object; and code that spins is contained."""

import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from forge_nb.live.capture import LiveCodeError
from forge_nb.session import Session
from tests.conftest import child_processes, wait_no_children

SCRIPT = textwrap.dedent("""
    import re

    import psutil

    import forge_nb
    import team_rewards

    LABELS = {"42": "answer"}
    DIGITS = re.compile(r"\\d+")


    def digits(text):
        return "".join(DIGITS.findall(text))


    def good(prompt, completion, target):
        return float(completion.strip().startswith(target))


    def shaped(prompt, completion, target):
        return 0.5 * float(digits(completion) == target) + 0.25 * float(target in LABELS)


    class Graded:
        def __init__(self, partial):
            self.partial = partial

        def __call__(self, prompt, completion, target, **context):
            return 1.0 if completion.strip() == target else self.partial


    if __name__ == "__main__":
        s = forge_nb.up(engine="torch", prompts_per_step=2, group_size=2, threads_per_proc=1)
        procs = len(psutil.Process().children(recursive=True))
        for reward in (good, shaped, Graded(0.25), team_rewards.accuracy):
            version = s.set_reward(reward)
            rollout = s.rollout()
            print("version", version, sorted({e.reward_version for e in rollout.episodes}), flush=True)
        print("procs", procs, len(psutil.Process().children(recursive=True)), flush=True)
        print("graded", sorted({e.reward for e in s.rollout().episodes} - {1.0}), flush=True)
        s.set_reward(Graded(0.25))
        print("graded", sorted({e.reward for e in s.rollout().episodes} - {1.0}), flush=True)
        print("log", s.run_dir / "server.log", flush=True)
        s.down()
""")

TEAM_REWARDS = textwrap.dedent("""
    def accuracy(prompt, completion, target, **context):
        return float(completion.strip() == target)
""")


def test_a_script_sets_rewards_from_functions_helpers_objects_and_a_module(tmp_path):
    (tmp_path / "train.py").write_text(SCRIPT)
    (tmp_path / "team_rewards.py").write_text(TEAM_REWARDS)
    out = subprocess.run([sys.executable, "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = out.stdout.splitlines()
    assert [line for line in lines if line.startswith("version")] == [
        f"version {v} [{v}]" for v in (1, 2, 3, 4)
    ]  # each version live in the actors from the next batch
    before, after = next(line for line in lines if line.startswith("procs")).split()[1:]
    assert before == after  # setting rewards started no second mesh
    log = Path(next(line for line in lines if line.startswith("log ")).split(" ", 1)[1])
    assert log.read_text().count("?it/s]") == 1  # one progress bar drawn from 0 in the session's server: one mesh
    graded = [line for line in lines if line.startswith("graded")]
    assert graded[-1] in ("graded []", "graded [0.25]")


@pytest.fixture
def s():
    session = Session.up(prompts_per_step=4, group_size=4, threads_per_proc=1, timeout_s=0.5, probe_size=8)
    session.step(1)
    yield session
    session.down()
    assert wait_no_children() == []


def _cpu_seconds(pids: list[int]) -> float:
    total = 0.0
    for pid in pids:
        try:
            times = psutil.Process(pid).cpu_times()
            total += times.user + times.system
        except psutil.NoSuchProcess:
            pass
    return total


def test_a_reward_that_spins_in_validation_is_refused_and_nothing_keeps_running(s):
    checker = s.pids["live_check"]
    kernel = psutil.Process()

    def spin(prompt, completion, target):
        while True:
            pass

    with pytest.raises(
        LiveCodeError, match=r"did not return within the 0.5 s timeout .*process that ran it was replaced"
    ):
        s.set_reward(spin)
    assert s.pids["live_check"] != checker and not any(psutil.pid_exists(p) for p in checker)
    start, cpu = time.monotonic(), kernel.cpu_times().user + kernel.cpu_times().system
    time.sleep(2.0)
    spent = kernel.cpu_times().user + kernel.cpu_times().system - cpu
    assert spent < 0.5 * (time.monotonic() - start), f"the kernel burned {spent:.2f} s of CPU"
    assert s.registry.live("reward").version == 0 and s.step(1).shape[0] == 1


def test_a_reward_that_spins_at_run_time_has_its_proc_replaced_and_the_run_goes_on(s):
    limit = s.state.next_sample_id  # later samples than the probe's

    def sometimes_spins(prompt, completion, target, sample_id):
        while sample_id >= limit + 2:
            pass
        return 1.0

    s.set_reward(sometimes_spins)
    old = s.pids["reward"]
    rollout = s.rollout()
    spun = [e for e in rollout.episodes if e.reward_error]
    assert spun and all("did not return within the 0.5 s per-sample timeout" in e.reward_error for e in spun)
    assert s.pids["reward"] != old and not any(psutil.pid_exists(p) for p in old)
    assert any(e["role"] == "reward" and "replaced" in e["what"] for e in s.status()["events"])
    cpu = _cpu_seconds([p.pid for p in child_processes()])
    time.sleep(2.0)
    assert _cpu_seconds([p.pid for p in child_processes()]) - cpu < 0.5, "a proc kept spinning"
    s.set_reward(version=0)
    assert s.step(2).shape[0] == 2  # the session goes on
