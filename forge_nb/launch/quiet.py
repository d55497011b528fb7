"""Keep library noise out of notebook cells, and in a log file.

Monarch and the libraries under it write straight to file descriptors 1 and 2: the kernel's own
native code ("Monarch internal logs are being written to ...") and every actor proc, which inherits
the kernel's descriptors when it is spawned ("[RdmaXcel] Can't open libcuda.so.1" on a machine
without CUDA, vLLM's INFO lines). A Jupyter kernel shows whatever reaches those descriptors in the
cell that runs, so this noise lands in the middle of a tutorial.

`route_native_output()` puts a pipe in front of descriptors 1 and 2 of a kernel, once, before the
first proc is spawned; a thread per pipe copies every line to `log_path()` and passes on to the
cell every line that is not known noise (`is_noise`). (A `print` inside a reward runs in a reward
proc and, with torchmonarch 0.7, does not reach the cell either way: measured, not solved.)
Monarch's job launchers log each Slurm submission through handlers of their own on stderr
("Submitting SLURM job with 1 nodes"); those loggers write to the log file instead. Outside a kernel
nothing changes: a terminal is not cluttered the same way, and pytest captures descriptors itself.
``FORGE_NB_QUIET=0`` turns the routing off.
"""

from __future__ import annotations

import getpass
import importlib
import logging
import os
import re
import select
import sys
import tempfile
import threading
from pathlib import Path

#: Lines that are noise in a cell (matched at the start of a line, after any "(ProcName pid=N) " prefix).
NOISE = re.compile(
    rb"(\(\w+ pid=\d+\) )?("
    rb"Monarch internal logs are being written to "  # Monarch's client, once per process
    rb"|\[RdmaXcel\] "  # Monarch's RDMA layer probing for CUDA / ibverbs on a CPU machine
    rb"|(INFO|DEBUG|WARNING) \d\d-\d\d \d\d:\d\d:\d\d(\.\d+)? \["  # vLLM's logger: "INFO 11-23 12:57:01 [file.py:12]"
    rb"|.*RDMATcpFallbackWarning"  # Monarch: RDMA over its TCP fallback (expected without ibverbs)
    rb"|\s+warnings\.warn\("  # the source line Python prints under such a warning
    rb")"
)

#: Loggers that Monarch gives a stderr handler of their own (so a notebook shows every line they log).
LAUNCHER_LOGGERS = ("monarch._src.job.job", "monarch._src.job.slurm")

_lock = threading.Lock()
_routed: Path | None = None
# A line with no newline yet is passed on after this long (a progress bar, or ipykernel's own
# shutdown byte, must not wait for a newline that never comes).
_PARTIAL_LINE_S = 0.1


def is_noise(line: bytes) -> bool:
    """Whether `line` (bytes as written, newline included or not) is library noise, not output."""
    return NOISE.match(line) is not None


def log_path() -> Path:
    """Where this process's native output and its actor procs' output are logged (every line, noise
    included): $FORGE_NB_LOG_DIR, else <tmp>/forge_nb-<user>, as output-<pid>.log."""
    folder = os.environ.get("FORGE_NB_LOG_DIR") or Path(tempfile.gettempdir()) / f"forge_nb-{getpass.getuser()}"
    return Path(folder) / f"output-{os.getpid()}.log"


def in_kernel() -> bool:
    """Whether this process is a Jupyter kernel (an IPython shell that talks over ZMQ)."""
    ipython = sys.modules.get("IPython")
    shell = ipython.get_ipython() if ipython is not None else None
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def route_native_output(force: bool = False) -> Path | None:
    """In a Jupyter kernel (or with `force`): from now on, descriptors 1 and 2 go through the noise
    filter; call it before spawning procs, so they inherit the filtered descriptors. Idempotent.
    -> the log file, or None when not routed (outside a kernel, or ``FORGE_NB_QUIET=0``)."""
    global _routed
    with _lock:
        if _routed is not None:
            return _routed
        if os.environ.get("FORGE_NB_QUIET", "1") == "0" or not (force or in_kernel()):
            return None
        path = log_path()
        path.parent.mkdir(parents=True, exist_ok=True)
        log = open(path, "ab", buffering=0)  # noqa: SIM115 -- kept open for the life of the process
        for fd in (1, 2):
            _filter(fd, log)
        _route_loggers(path)
        _routed = path
        return path


def _route_loggers(path: Path) -> None:
    """Swap the stderr handlers of `LAUNCHER_LOGGERS` for one that appends to `path`."""
    to_file = logging.FileHandler(path, encoding="utf-8")
    to_file.setFormatter(logging.Formatter("%(asctime)s %(name)s %(levelname)s: %(message)s"))
    for name in LAUNCHER_LOGGERS:
        try:
            importlib.import_module(name)  # it adds its handler at import: import first, then swap it
        except ImportError:  # another Monarch layout: nothing to quiet
            continue
        logger = logging.getLogger(name)
        for handler in list(logger.handlers):
            if type(handler) is logging.StreamHandler:
                logger.removeHandler(handler)
        logger.addHandler(to_file)


def _filter(fd: int, log) -> None:
    """Put a pipe in front of `fd`; a daemon thread logs each line and passes on what is not noise."""
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:  # a closed or odd stream: nothing of ours to flush
            pass
    target = os.dup(fd)  # where `fd` went until now (in a kernel: ipykernel's pipe to the cell)
    read_end, write_end = os.pipe()
    os.dup2(write_end, fd)
    os.close(write_end)
    threading.Thread(target=_pump, args=(read_end, target, log), name=f"forge_nb-quiet-{fd}", daemon=True).start()


def _pump(read_end: int, target: int, log) -> None:
    pending = b""
    while True:
        ready, _, _ = select.select([read_end], [], [], _PARTIAL_LINE_S if pending else None)
        if not ready:  # a partial line that stayed partial: pass it on as it is
            _emit(pending, target, log)
            pending = b""
            continue
        chunk = os.read(read_end, 65536)
        if not chunk:
            _emit(pending, target, log)
            return
        *lines, pending = re.split(rb"(?<=[\n\r])", pending + chunk)
        for line in lines:
            _emit(line, target, log)


def _emit(line: bytes, target: int, log) -> None:
    if not line:
        return
    try:
        log.write(line)
    except OSError:  # a full disk must not silence the cell too
        pass
    if not is_noise(line):
        os.write(target, line)
