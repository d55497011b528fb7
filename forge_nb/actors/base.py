"""What every forge_nb actor shares: per-proc set-up and a readiness endpoint.

Monarch refuses an actor class whose endpoints mix ``def`` and ``async def``, so there are two
bases with the same `ready` endpoint: `ForgeActor` (plain endpoints) and `AsyncForgeActor` (async
ones, for the generator, whose refresh awaits RDMA reads).
"""

from __future__ import annotations

import os
import socket
import sys
import time
from dataclasses import dataclass, field

from monarch.actor import Actor, endpoint

from forge_nb import heap
from forge_nb.runtime import last_words, refusals


@dataclass(frozen=True)
class ActorInfo:
    """Who answered: the proc's pid and host, and how long the actor's constructor took (s)."""

    role: str
    pid: int
    hostname: str
    start_s: float
    details: dict = field(default_factory=dict)  # role-specific, e.g. {"engine": "vllm"}


def setup_proc(threads: int) -> None:
    """Per-proc set-up every actor runs first: a thread budget for torch and OpenMP, and no progress bars
    (an actor's stdout is forwarded to the controller; bars would interleave there).

    A proc that has not imported torch or transformers by now (a reward worker: rewards are plain Python;
    the checker has torch, for losses, not transformers) does not import them for this -- 1-3 s of CPU a
    proc, at every start and respawn; the environment tells them the same should user code import them later."""
    os.environ["HF_HUB_DISABLE_PROGRESS_BARS"] = "1"  # transformers' bars follow huggingface_hub's switch
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(threads)
    else:
        os.environ["OMP_NUM_THREADS"] = str(threads)  # torch takes its thread count from it when imported
    if "transformers" in sys.modules:
        from transformers.utils import logging

        logging.disable_progress_bar()


class _Started:
    """Records when construction began and builds the `ActorInfo` answer."""

    role = "actor"

    def _begin(self, threads: int) -> None:
        self._started_at = time.perf_counter()
        last_words.forget()  # words an earlier proc with this pid left are not this one's
        setup_proc(threads)

    def _ready(self, **details) -> None:
        """Call at the end of the constructor: from now on `ready` answers."""
        start_s = time.perf_counter() - self._started_at
        self._info = ActorInfo(self.role, os.getpid(), socket.gethostname(), start_s, details)
        heap.freeze()  # the proc's start-up heap (torch, the model, the engine) out of full collections


class ForgeActor(_Started, Actor):
    """Base of the actors with plain endpoints (trainer, reward workers, reference)."""

    @endpoint
    def ready(self) -> ActorInfo:
        """Answers once the constructor has finished (or raises its error) -> who and where."""
        return self._info

    @endpoint
    def refusals(self) -> dict[str, int]:
        """What this proc's listeners (a trainer's weights streams) and its host's worker refused so far."""
        return refusals.process_totals()


class AsyncForgeActor(_Started, Actor):
    """Base of the actors with async endpoints (the generator)."""

    @endpoint
    async def ready(self) -> ActorInfo:
        """Answers once the constructor has finished (or raises its error) -> who and where."""
        return self._info

    @endpoint
    async def refusals(self) -> dict[str, int]:
        """What this proc's listeners (an env proc's agents' endpoint) and its host's worker refused so far."""
        return refusals.process_totals()
