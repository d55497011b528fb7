"""In a real kernel, a session's start and steps show no library noise in the cell, while a log file keeps it:
the session's server's (its procs' output goes there; moved into the run directory at `down`). (A `print`
inside a reward runs in a reward proc and does not reach the cell: see launch/quiet.py.)"""

from __future__ import annotations

from pathlib import Path

from tests.conftest import wait_no_children
from tests.notebook.kernel import Kernel

CELLS = [
    "import forge_nb\ns = forge_nb.up(prompts_per_step=4, group_size=4, threads_per_proc=1)",
    "s.set_reward('def reward(prompt, completion, target, **context):\\n    return 1.0\\n')",
    "s.step(2, progress=False); s.sync()",
    "print('LOG', s.run_dir / 'server.log')",
    "s.down()",
]


def test_cells_show_no_monarch_noise_and_the_servers_log_keeps_it():
    kernel = Kernel()
    try:
        shown = [kernel.ok(cell, timeout=180) for cell in CELLS]
    finally:
        kernel.stop()
    everything = "".join(shown)
    for noise in ("Monarch internal logs are being written", "[RdmaXcel]"):
        assert noise not in everything
    log = Path(shown[3].split("LOG ", 1)[1].strip())
    assert "Monarch internal logs are being written" in log.read_text()
    assert wait_no_children() == []
