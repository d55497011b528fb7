"""The suite's temp folder: every process of a run (pytest's workers, kernels, mesh procs, vLLM, Chromium,
Slurm's jobs) makes its temporary files under one folder of that run, a subfolder per pytest process
(``TMPDIR``, inherited), which goes when the run ends. What the tests leave there is named at the end, and
fails the run (conftest.py's `pytest_sessionfinish`).

Why: left in the system's temp folder, such files piled up over runs (tutorial 05's 2.2 GB checkpoint each
run, 64 GB on one machine in a day) until a CI run on that disk failed with "No space left on device".
pytest's own `tmp_path` folders stay in the system's temp folder (pyproject keeps only failed tests' ones,
for a look after the run), and so does torch's compile cache, a cache across runs.
"""

from __future__ import annotations

import atexit
import getpass
import os
import shutil
import tempfile
import time
from pathlib import Path

ENV = "FORGE_NB_SUITE_TMP"  # the run's folder; set once, by the first pytest process (the controller)
RUNS = "runs"  # FORGE_NB_RUNS, the sessions' run directories: removed with the folder, not a leftover
#: Folders of this user on this host that outlive a process by design, not leftovers: kernels' output logs
#: (mesh/quiet.py, kept for a look after a kernel ended), what procs said before they ended themselves
#: (mesh/last_words.py, emptied by the session that reads it), the host workers' fork servers' sockets
#: (mesh/workerforks.py, each removed with its server).
PER_USER = (f"forge_nb-{getpass.getuser()}", f"forge_nb-last-words-{os.getuid()}", f"forge_nb-forks-{os.getuid()}")


def set_up() -> Path:
    """Make the run's folder (first call in a run) and point this process's temp folder at its own
    subfolder in it (named after the xdist worker; "main" for the controller) -> that subfolder."""
    if ENV not in os.environ:
        system = tempfile.gettempdir()
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)  # where pytest puts tmp_path
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(system, f"torchinductor_{getpass.getuser()}"))
        os.environ[ENV] = tempfile.mkdtemp(prefix="forge_nb-suite-")
        atexit.register(shutil.rmtree, os.environ[ENV], ignore_errors=True)
        os.environ.setdefault("FORGE_NB_RUNS", os.path.join(os.environ[ENV], RUNS))
    own = Path(os.environ[ENV]) / os.environ.get("PYTEST_XDIST_WORKER", "main")
    own.mkdir(parents=True, exist_ok=True)
    os.environ["TMPDIR"] = tempfile.tempdir = str(own)
    return own


def leftovers(wait_s: float = 10.0) -> dict[str, int]:
    """What the run's processes left in its folder -> {path under the folder: bytes}. Waits up to `wait_s`
    for what is going anyway (a fork server removes its own folder once its worker is gone)."""
    root = Path(os.environ[ENV])
    deadline = time.monotonic() + wait_s
    while True:
        found = {
            f"{sub.name}/{entry.name}": _size(entry)
            for sub in sorted(root.iterdir())
            if sub.is_dir() and sub.name != RUNS
            for entry in sorted(sub.iterdir())
            if entry.name not in PER_USER
        }
        if not found or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def describe(found: dict[str, int]) -> str:
    """`leftovers()` as lines for the end of the run."""
    lines = [f"  {name}  ({size / 1e6:.1f} MB)" for name, size in found.items()]
    return "\n".join([f"the tests left these in the run's temp folder {os.environ[ENV]} (by worker):", *lines])


def _size(path: Path) -> int:
    try:
        if path.is_symlink() or not path.is_dir():
            return path.lstat().st_size
    except OSError:  # gone meanwhile
        return 0
    total = 0
    for dirpath, _, files in os.walk(path):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:  # gone meanwhile
                pass
    return total
