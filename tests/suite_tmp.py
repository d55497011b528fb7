"""The suite's temp folder: every process of a run (pytest's workers, kernels, mesh procs, vLLM, Chromium,
Slurm's jobs) makes its temporary files under one folder of that run, a subfolder per pytest process
(``TMPDIR``, inherited), which goes when the run ends. What the tests leave there with data in it is named at
the end and fails the run (conftest.py's `pytest_sessionfinish`); what holds no data (the sockets and empty
folders of processes that were killed: Monarch's, vLLM's, a kernel's fork server) is counted, not a failure.

Why: left in the system's temp folder, such files piled up over runs (tutorial 05's 2.2 GB checkpoint each
run, 64 GB on one machine in a day) until a CI run on that disk failed with "No space left on device".
pytest's own `tmp_path` folders stay in the system's temp folder (pyproject keeps only failed tests' ones,
for a look after the run), and so do torch's compile caches, caches across runs.
"""

from __future__ import annotations

import atexit
import gc
import getpass
import os
import re
import shutil
import tempfile
import time
from pathlib import Path

ENV = "FORGE_NB_SUITE_TMP"  # the run's folder; set once, by the first pytest process (the controller)
RUNS = "runs"  # FORGE_NB_RUNS, the sessions' run directories: removed with the folder, not a leftover
#: FORGE_NB_RUNTIME_DIR, the run's session servers' folders (socket, key, info): a test's `forge-nb down --all`
#: ends the run's sessions, not the user's own; a session's folder left there is a leftover.
SESSIONS = "sessions"
#: Folders of this user on this host that outlive a process by design, not leftovers: kernels' output logs
#: (launch/quiet.py, kept for a look after a kernel ended), what procs said before they ended themselves
#: (runtime/last_words.py, emptied by the session that reads it), the host workers' fork servers' sockets
#: (launch/forks/on_workers.py, each removed with its server).
PER_USER = (f"forge_nb-{getpass.getuser()}", f"forge_nb-last-words-{os.getuid()}", f"forge_nb-forks-{os.getuid()}")
#: torch's compile cache: vLLM's CPU build puts its precompiled headers (156 MB) in <tmp>/torchinductor_<user>
#: whatever TORCHINDUCTOR_CACHE_DIR says; each process's folder links it to the system's, kept across runs.
INDUCTOR = f"torchinductor_{getpass.getuser()}"
#: vLLM's rendezvous file of a tensor-parallel engine (``vllm_dist_<uuid>``, a few kB): an engine whose rank is
#: killed leaves it (tests/engines/test_vllm_tp.py kills one on purpose); it goes with the run's folder.
VLLM_RENDEZVOUS = re.compile(r"vllm_dist_[0-9a-f]{32}")


def set_up() -> Path:
    """Make the run's folder (first call in a run) and point this process's temp folder at its own
    subfolder in it (named after the xdist worker; "main" for the controller) -> that subfolder."""
    if ENV not in os.environ:
        system = tempfile.gettempdir()
        os.environ.setdefault("PYTEST_DEBUG_TEMPROOT", system)  # where pytest puts tmp_path
        os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", os.path.join(system, INDUCTOR))
        os.environ[ENV] = tempfile.mkdtemp(prefix="forge_nb-suite-")
        atexit.register(shutil.rmtree, os.environ[ENV], ignore_errors=True)  # (the cache link, not the cache)
    os.environ.setdefault("FORGE_NB_RUNS", os.path.join(os.environ[ENV], RUNS))
    os.environ.setdefault("FORGE_NB_RUNTIME_DIR", os.path.join(os.environ[ENV], SESSIONS))
    own = Path(os.environ[ENV]) / os.environ.get("PYTEST_XDIST_WORKER", "main")
    own.mkdir(parents=True, exist_ok=True)
    cache = Path(os.environ.get("TORCHINDUCTOR_CACHE_DIR") or Path(os.environ[ENV]).parent / INDUCTOR)
    if not (own / INDUCTOR).is_symlink():
        cache.mkdir(parents=True, exist_ok=True)
        (own / INDUCTOR).symlink_to(cache)
    os.environ["TMPDIR"] = tempfile.tempdir = str(own)
    return own


def clean_up_at_exit_now() -> None:
    """Remove now the temporary folders this process removes at its exit anyway: a library's
    `tempfile.TemporaryDirectory` still held when the tests end (W&B keeps one per logged table until the
    interpreter exits), which the leftover check runs before. A pytest worker's are gone before the check."""
    for held in [o for o in gc.get_objects() if type(o) is tempfile.TemporaryDirectory]:  # (no proxy's __class__)
        if Path(held.name).is_relative_to(os.environ[ENV]):
            held.cleanup()


def leftovers(wait_s: float = 5.0) -> dict[str, int]:
    """What the run's processes left in its folder -> {path under the folder: bytes}. Waits up to `wait_s`
    for what holds data to go (a kernel's temporary folder goes as it exits)."""
    root = Path(os.environ[ENV])
    deadline = time.monotonic() + wait_s
    while True:
        found = {
            f"{sub.name}/{entry.name}": _size(entry)
            for sub in sorted(root.iterdir())
            if sub.is_dir() and sub.name != RUNS
            for entry in sorted(sub.iterdir())
            if entry.name not in (*PER_USER, INDUCTOR) and not VLLM_RENDEZVOUS.fullmatch(entry.name)
        }
        if not any(found.values()) or time.monotonic() > deadline:
            return found
        time.sleep(0.5)


def describe(found: dict[str, int]) -> str:
    """`leftovers()` for the end of the run: what holds data, by name; the rest counted."""
    out = []
    if any(found.values()):
        out.append(f"the tests left these in the run's temp folder {os.environ[ENV]} (by worker):")
        out += [f"  {name}  ({size:,} bytes)" for name, size in found.items() if size]
    empty = sum(1 for size in found.values() if not size)
    if empty:
        out.append(f"sockets or empty folders that killed processes left there: {empty} (no data: not a failure)")
    return "\n".join(out)


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
