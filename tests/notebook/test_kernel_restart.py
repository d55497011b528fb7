"""A session outlives its kernel: `%forge up`, a background run, the kernel restarted (or killed) mid-run, and
the next kernel takes the session up again -- the run went on meanwhile, the weights are the ones trained, live
code swaps, and `%forge down` leaves no process, the server included. In real kernels (jupyter_client)."""

from __future__ import annotations

import time

import psutil
import pytest

from forge_nb.server.registry import SessionDir
from tests.conftest import wait_gone
from tests.notebook.kernel import Kernel

UP = "%forge up prompts_per_step=4 group_size=4 threads_per_proc=1"
REWARD = "%%forge reward\ndef reward(prompt, completion, target, **context):\n    return float(completion == target)\n"


@pytest.mark.parametrize("how", ["restart", "sigkill"])
def test_a_session_outlives_its_kernel_and_the_next_kernel_goes_on_with_it(how, tmp_path):
    notebook = tmp_path / f"train-{how}.ipynb"  # JupyterLab tells a kernel its notebook's path
    k = Kernel(env={"JPY_SESSION_NAME": str(notebook)})
    try:
        k.ok("%load_ext forge_nb")
        assert "session: train-" in k.ok(UP)  # the cell says what came up
        name = k.json("__import__('forge_nb.runtime.lifecycle', fromlist=['x']).current().name")
        k.ok("s = __import__('forge_nb.runtime.lifecycle', fromlist=['x']).current()")
        k.ok("%forge run")
        deadline = time.monotonic() + 120
        while k.json("s.step_count") < 2 and time.monotonic() < deadline:
            time.sleep(0.5)
        before = k.json("s.step_count")
        assert before >= 2
        folder = SessionDir.named(name)
        server = folder.info().pid
        k.restart(kill=how == "sigkill")  # no kernel holds the session now
        time.sleep(3)
        assert folder.info().clients == [] or how == "sigkill"  # (a killed kernel's socket closes at once too)
        k.ok("%load_ext forge_nb")
        if how == "restart":
            attached = k.ok("%forge attach")
        else:  # "Restart and Run All": the notebook's first cell is %forge up again, and it attaches
            attached = k.ok(UP)
        assert f"session '{name}'" in attached or f"session {name!r}" in attached, attached
        k.ok("s = __import__('forge_nb.runtime.lifecycle', fromlist=['x']).current()")
        assert k.json("s.step_count") > before  # the background run went on while no kernel existed
        k.ok("%forge stop")
        trained = k.json("s.trainer_version")
        row = k.json("[int(v) for v in s.step(1).iloc[-1][['policy_version', 'generator_version']]]")
        assert row == [trained + 1, trained + 1]  # it trains on from the version before
        sums = k.json("s.checksums()")
        assert sums["trainer"] == sums["generator"]  # the generator serves the trainer's weights, bit for bit
        live = k.json("int(s.versions('reward').version.max())")
        assert f"reward v{live + 1} is live" in k.ok(REWARD)
        procs = [p for ps in k.json("s.pids").values() for p in ps]
        assert "is down" in k.ok("%forge down")
    finally:
        k.run("%forge down")
        k.stop()
    assert wait_gone([server, *procs], 30) == []
    assert not folder.path.exists()
    assert all(not p.info["cmdline"] or "forge_nb.server" not in " ".join(p.info["cmdline"])
               or str(folder.path) not in " ".join(p.info["cmdline"])
               for p in psutil.process_iter(["cmdline"]))  # fmt: skip
