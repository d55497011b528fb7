"""Supervision of the fleet: a proc that died is started afresh and the call issued again.

Before each call, a role whose proc Monarch reported dead (`runtime.supervision.FAULTS`) is started
afresh; a call that fails because its actor's proc died starts the role afresh and is issued once
more. How each role starts afresh is the fleet's (`Fleet.replace`): a new generator attaches to the
published weights and loads the policy version it served; new reward workers get the live reward set; a
new reference model loads the frozen weights; a new checker is just started; a new judge loads its model
and is attached to the reward procs and the checker (a batch whose judge died mid-call is scored again,
`Fleet.score`). Work is deterministic given its seed, so the call issued again makes the same samples.
The trainer holds state no other proc has: it is restored from the last checkpoint when
`checkpoint.on_trainer_failure` is "restore", else its death is `TrainerLost`. A trainer gang
(`mesh.trainer_procs` > 1) is one role: one rank that dies, or hangs until its peers' collectives time
out (`GangError`, after `trainer.collective_timeout_s`), restarts all of them. A generator that a refresh
left torn (`weights.refresh.TornWeights`: a load failed part way) is replaced as a dead one is: its fresh
procs load a whole version, and the call is issued again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from monarch.actor import ActorError

from forge_nb.actors.trainer import LossFailed
from forge_nb.engines.base import WeightsRefused
from forge_nb.parallel.gang import GangError
from forge_nb.runtime import last_words, supervision
from forge_nb.runtime.supervision import SupervisionError
from forge_nb.weights.refresh import RefreshError, TornWeights

if TYPE_CHECKING:
    from forge_nb.fleet.fleet import Fleet

T = TypeVar("T")


class TrainerLost(RuntimeError):
    """The trainer's proc died; its weights and optimizer state went with it."""


class CheckpointLost(RuntimeError):
    """The trainer died while it wrote a checkpoint: it was restarted (from the checkpoint before, or
    `TrainerLost`) and this checkpoint was not written."""


class Recovery:
    """When to start a role of `fleet` afresh, and the call issued again; one thread at a time."""

    def __init__(self, fleet: Fleet) -> None:
        self.fleet = fleet
        self.faults_seen = len(supervision.FAULTS)
        self.respawned_at: dict[str, float] = {}  # role -> when it was last started afresh
        self.lock = threading.RLock()  # an async run heals from two threads: each dead role is respawned once

    def supervised(self, role: str, call: Callable[[], T], since: float | None = None) -> T:
        """`call()`, after healing the roles Monarch reported dead; once more if `role` died during it (restarted
        unless another thread did since `call` started, or since `since`: when its messages went earlier)."""
        self.heal()
        started = time.time() if since is None else since
        try:
            return call()
        except (SupervisionError, ActorError, GangError) as e:  # GangError: a rank hung (`calls.GangFuture`)
            # A generator a failed load left torn is replaced like a dead one: fresh procs load a whole version.
            # Whoever called it (an env proc too).
            lost = "generator" if isinstance(innermost(e), TornWeights) else role if procs_lost(e) else None
            if lost is None:
                said = said_by_forge_nb(e)
                if said is e:
                    raise
                raise said from e
            with self.lock:
                if self.respawned_at.get(lost, 0.0) < started:  # else another thread has just respawned it
                    self.respawn(lost, cause_of(e))
            return call()

    def trainer_saves(self, call: Callable[[], T]) -> T:
        """`call()`, a save by the trainer. If the trainer dies during it, it is restarted (the state it
        saved dies with it, so the save is not issued again) and `CheckpointLost` is raised."""
        self.heal()
        try:
            return call()
        except (SupervisionError, ActorError, GangError) as e:
            if not procs_lost(e):
                raise
            cause = cause_of(e)
            self.respawn("trainer", cause)
            raise CheckpointLost(f"the trainer died while saving ({cause}); nothing was saved") from None

    def heal(self) -> None:
        """Start afresh every role whose proc Monarch reported dead since it was last started."""
        with self.lock:
            faults = supervision.FAULTS.since(self.faults_seen)
            self.faults_seen += len(faults)
            for fault in faults:
                if fault.role in self.fleet.info and fault.time > self.respawned_at.get(fault.role, 0.0):
                    self.respawn(fault.role, fault.message.splitlines()[-1].strip())

    def respawn(self, role: str, cause: str) -> None:
        """Replace `role`'s procs and bring the new actors to where the old ones were (`Fleet.replace`)."""
        with self.lock:
            fleet = self.fleet
            cause = last_words.with_words(cause, fleet.local_pids(role))  # why a proc of this host ended itself
            check_hosts = getattr(fleet.mesh, "check_hosts", None)
            if check_hosts is not None:  # several hosts: one that is gone is reported, not started on again
                check_hosts(role)
            before = self.respawned_at.get(role, 0.0)
            self.respawned_at[role] = time.time()
            try:
                fleet.replace(role, cause)
            except BaseException:
                self.respawned_at[role] = before  # a replacement that failed is none: the next call tries again
                raise


def innermost(error: BaseException) -> BaseException:
    """The exception a proc raised, through Monarch's wrappers (a call an env proc made to a generator
    comes wrapped twice)."""
    while isinstance(error, ActorError) and isinstance(error.exception, BaseException) and error.exception is not error:
        error = error.exception
    return error


def said_by_forge_nb(error: SupervisionError | ActorError) -> BaseException:
    """The exception a proc raised when its message is meant for the user (a refresh refused or torn, the live
    loss failing on a batch), in place of Monarch's wrappers around it; else `error` itself."""
    inner = innermost(error)
    return inner if isinstance(inner, (RefreshError, TornWeights, WeightsRefused, LossFailed)) else error


def procs_lost(error: SupervisionError | ActorError | GangError) -> bool:
    """Whether a failed call lost its role's procs: Monarch reported them dead, or a gang's collective
    failed or a rank hung (`GangError`); not an error the actor raised and survived."""
    return not isinstance(error, ActorError) or isinstance(error.exception, GangError)


def cause_of(error: Exception) -> str:
    """The last line of Monarch's report: "the process this actor was running on failed: Killed(sig=9)"."""
    return str(error).strip().splitlines()[-1].strip()
