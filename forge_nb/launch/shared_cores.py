"""What a proc gets when it shares this host's cores with the session's other procs (a local mesh): a short
OpenMP spin. Imports nothing but the standard library: the session server sets it before it imports torch
(`launch.forks.early`), since libgomp reads it once, when torch loads it."""

from __future__ import annotations

import os

#: OpenMP busy-wait iterations before an idle thread sleeps, in every proc of a local mesh. libgomp's default
#: (300000, milliseconds of spinning) suits one process that has the cores to itself; a mesh's procs take turns
#: on the same cores (generator, then reward, trainer, generator), and each one's threads kept spinning through
#: the next one's phase: benchmarks/overhead.py's mesh step took 57 ms at libgomp's default, 45 ms at 10000 (also
#: 1000 and 30000 were measured; the plain loop, 34 ms, is one process and keeps the default).
SPINCOUNT = "10000"


def proc_env() -> dict[str, str]:
    """Environment variables this host's procs get on top of the kernel's: a short OpenMP spin
    (`SPINCOUNT`), unless the user chose a wait policy (GOMP_SPINCOUNT or OMP_WAIT_POLICY set)."""
    if "GOMP_SPINCOUNT" in os.environ or "OMP_WAIT_POLICY" in os.environ:
        return {}
    return {"GOMP_SPINCOUNT": SPINCOUNT}
