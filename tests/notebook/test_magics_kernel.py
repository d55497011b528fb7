"""Every %forge magic in a real IPython kernel driven through jupyter_client."""

import json
import subprocess
import sys
import time

import psutil
import pytest

from forge_nb.server import zygote
from forge_nb.server.registry import SessionDir
from tests.conftest import wait_gone
from tests.notebook.kernel import Kernel

UP = "%forge up prompts_per_step=4 group_size=4 threads_per_proc=1 timeout_s=2.0"


@pytest.fixture(scope="module")
def kernel():
    """A kernel with the extension loaded and a session up (each test may assume both, in any order)."""
    k = Kernel()
    k.ok("%load_ext forge_nb")
    k.ok(UP)
    yield k
    k.ok("%forge down")
    k.stop()


def _descendants(pid: int) -> list[int]:
    """The live processes under `pid`, but for zygotes (they fork session servers and outlive sessions)."""
    try:
        found = [p.pid for p in psutil.Process(pid).children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    except psutil.NoSuchProcess:
        return []
    return sorted(set(found) - set(zygote.pids()))


def _session_processes(k: Kernel) -> list[int]:
    """The kernel's session's server and every process under it (a zygote forked the server: they need not be the
    kernel's descendants), and the kernel's own."""
    name = k.json("__import__('forge_nb.runtime.lifecycle', fromlist=['x']).current().name")
    server = int(SessionDir.named(name).info().pid)
    return sorted({server, *_descendants(server), *_descendants(k.pid)})


def test_every_magic_runs(kernel, tmp_path):
    assert "reusing it" in kernel.ok(UP)  # a second %forge up with the same config reuses the session
    text, content = kernel.run("%forge up lr=0.1")
    assert content["status"] == "error" and "another config is up; run %forge down first" in text
    assert "'up': True" in kernel.ok("%forge status")
    assert "mean_reward" in kernel.ok("%forge step 2")
    assert "'skipped': True" in kernel.ok("%forge sync")  # step already synced
    assert "completion" in kernel.ok("%forge samples 5")
    out = kernel.ok(
        "%%forge reward\ndef reward(prompt, completion, target, **context):\n    return float(len(completion) > 1)\n"
    )
    assert "reward v1 is live" in out
    text, content = kernel.run("%%forge loss\ndef loss(logprobs, old_logprobs, advantages, mask):\n    return 1.0\n")
    assert content["status"] == "error" and "loss v1 (cell" in text and "v0 stays live" in text
    assert "rejected" in kernel.ok("%forge versions")
    assert "heldout_accuracy" in kernel.ok("%forge eval")
    assert "DashboardBox" in kernel.ok("%forge dashboard")
    assert "VBox" in kernel.ok("%forge explore")
    assert "trainer_logprobs" in kernel.ok("pd_out = %forge samples --step 2\nprint(pd_out.columns.tolist())")
    assert "Output" in kernel.ok("%forge watch all_equal_groups=1.5 grad_norm=1e6")
    assert "watch off" in kernel.ok("%forge watch off")
    assert "resume with forge_nb.resume(" in kernel.ok(f"%forge save {tmp_path / 'ck'}")
    assert "exported to" in kernel.ok(f"%forge export {tmp_path / 'run'} --steps 3")
    assert "len(completion) > 1" in (tmp_path / "run" / "reward.py").read_text()
    assert (tmp_path / "run" / "checkpoint" / "model.safetensors").is_file()
    assert json.loads((tmp_path / "run" / "manifest.json").read_text())["steps"] == 3
    text, content = kernel.run("%forge frobnicate")
    assert content["status"] == "error" and "unknown subcommand" in text


def test_background_run_advances_while_other_cells_execute(kernel):
    kernel.ok("from forge_nb.runtime import lifecycle; s = lifecycle.current(); start = s.step_count")
    kernel.ok("%forge run")
    seen = [int(kernel.ok("print(s.step_count - start)").strip())]
    for _ in range(40):  # other cells keep executing while the run steps
        time.sleep(0.3)
        seen.append(int(kernel.ok("print(s.step_count - start)").strip()))
        if seen[-1] >= 3 and seen[-1] > seen[0]:
            break
    assert seen[-1] >= 3 and seen[0] < seen[-1], seen
    kernel.ok("%forge pause")
    time.sleep(1.0)
    paused = int(kernel.ok("print(s.step_count)").strip())
    time.sleep(0.8)
    assert int(kernel.ok("print(s.step_count)").strip()) == paused
    assert "paused" in kernel.ok("print(s.status()['run'])")
    kernel.ok("%forge resume")
    kernel.ok("%forge sync")  # works from another cell while the run goes on
    kernel.ok("%forge stop")
    assert "finished" in kernel.ok("print(s.status()['run'])")


def test_down_leaves_no_process_and_a_kernel_shutdown_leaves_the_session_to_its_server():
    k = Kernel()
    try:
        k.ok("import os; os.environ['FORGE_NB_FORK_LINGER_S'] = '0'")  # the default outside the suite
        k.ok("%load_ext forge_nb")
        k.ok(UP)
        running = _session_processes(k)
        assert len(running) >= 3
        assert "is down" in k.ok("%forge down")
        assert wait_gone(running, 10) == []
        assert _descendants(k.pid) == []
        assert "no session is up" in k.ok("%forge down")  # says so, rather than nothing
        k.ok(UP + " --name left")  # up again after down; then shut the kernel down with the session up
        procs = [psutil.Process(p) for p in _session_processes(k)]
    finally:
        k.client.stop_channels()
        k.manager.shutdown_kernel(now=False)
    time.sleep(2)
    assert all(p.is_running() for p in procs)  # the session outlives its kernel, in its server
    ended = subprocess.run([sys.executable, "-m", "forge_nb.cli", "down", "left"], capture_output=True, text=True)
    assert "left: down" in ended.stdout, ended.stdout + ended.stderr
    gone, alive = psutil.wait_procs(procs, timeout=30)
    assert alive == []


def test_a_cell_that_starts_the_session_and_defines_the_reward_starts_one_mesh():
    k = Kernel()
    try:
        out = k.ok(
            "import psutil, forge_nb\n"
            "s = forge_nb.up(prompts_per_step=2, group_size=2, threads_per_proc=1)\n"
            "LIMIT = 2\n"
            "def reward(prompt, completion, target, **context):\n"
            "    return float(len(completion) <= LIMIT)\n"
            "before = len(psutil.Process().children(recursive=True))\n"
            "print('version', s.set_reward(reward), before == len(psutil.Process().children(recursive=True)))\n"
        )
        assert "version 1 True" in out
        k.ok("%load_ext forge_nb")
        k.ok("THRESHOLD = len('abc')  # computed in another cell: its value travels")
        cell = "def short(prompt, completion, target, **context):\n    return float(len(completion) < THRESHOLD)\n"
        out = k.ok("%%forge reward\n" + cell)
        assert "reward v2 is live" in out
        assert "THRESHOLD = 3" in k.ok("print(s.registry.live('reward').code.source)")
        k.ok("r = s.rollout(); assert all(e.reward == float(len(e.completion) < 3) for e in r.episodes)")
        k.ok("%forge down")
    finally:
        k.client.stop_channels()
        k.manager.shutdown_kernel(now=True)
