"""The session server's fork server, forked from the server itself before it imports Monarch.

A session server imports torch and transformers anyway (the session holds the tokenizer and computes advantages),
so a fork server that imports them again in an interpreter of its own costs every `forge_nb.up()` those imports
(~3 s of CPU, in series with the server's own). `start`, called first thing in ``python -m forge_nb.server``,
imports the fork server's `PRELOAD` and forge_nb's heavy modules (`EARLY`) in the server process and forks the fork
server from it (`ForkServer.forked`): it serves the session's first procs at once, and they import less. It must
run before anything imports Monarch, whose runtime starts threads a fork cannot carry. The environment its imports
see is the procs' (`shared_cores.proc_env`, set in the server's own environment: libgomp reads it once, when torch
loads it), so the server shares the procs' short OpenMP spin.

``FORGE_NB_FORK_PREFORK=0`` (or ``FORGE_NB_FORK_PROCS=0``) turns it off: the session's mesh starts its fork server
as a kernel's does. A session whose procs do not fork (GPUs) stops it once it is up (`drop_unused`).
"""

from __future__ import annotations

import contextlib
import os
import sys

from forge_nb.launch.forks import server as forkserver
from forge_nb.launch.shared_cores import proc_env

PREFORK_ENV = "FORGE_NB_FORK_PREFORK"
#: What the server imports here, before the fork: the fork server's `PRELOAD`, and the agents' OpenAI client (which
#: the server imports anyway, and an env or reward proc again); none of them imports Monarch (`start` checks).
EARLY = (*forkserver.PRELOAD, "forge_nb.agents.client")
_server: forkserver.ForkServer | None = None


def wanted() -> bool:
    """Whether a server forks its fork server (`start`): on Linux, unless ``FORGE_NB_FORK_PREFORK=0`` or
    ``FORGE_NB_FORK_PROCS=0`` (no procs fork at all)."""
    return os.environ.get(PREFORK_ENV) != "0" and forkserver.forks_here() and "monarch" not in sys.modules


def start() -> None:
    """Import `EARLY` here and fork this process's fork server, offered to its first local mesh
    (`forkserver.acquire` takes it). Call it before anything imports Monarch; a no-op when not `wanted`."""
    global _server
    if not wanted():
        return
    warm_up()
    if "monarch" in sys.modules:  # one of them came to import it: no fork (its runtime's threads)
        return
    _server = forkserver.ForkServer.forked()
    forkserver.offer(_server)


def warm_up() -> None:
    """Import `EARLY` here, in the environment the procs' imports must see (`proc_env`, set in this process's own:
    the mesh's `acquire` compares it). What `start` does before it forks; a zygote's once, for every server it
    forks (`server.zygote`: there, `start` finds them imported)."""
    os.environ.update(proc_env())
    for name in EARLY:
        with contextlib.suppress(Exception):  # a missing optional piece: the procs import what they need
            __import__(name)


def drop_unused() -> None:
    """Once the session is up: stop the forked server if no mesh took it (procs on GPUs start fresh)."""
    if _server is not None:
        forkserver.stop_unused(_server)
