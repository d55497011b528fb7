"""Supervision of the session's roles: a proc that died is started afresh and the call issued again.

Before each call, a role whose proc Monarch reported dead (`runtime.supervision.FAULTS`) is started
afresh; a call that fails because its actor's proc died starts the role afresh and is issued once
more. A new generator attaches to the published weights and loads the policy version it served; new
reward workers get the live reward set (`Roles.replace_rewards`); a new reference model loads the
frozen weights; a new checker is just started; a new judge loads its model and is attached to the
reward procs and the checker (`fleet.judges.JudgePool.respawn`; a batch whose judge died mid-call is
scored again, `Roles.score`). Work is deterministic given its seed, so the call issued again makes
the same samples. The trainer holds state no other proc has: it is restored from
the last checkpoint when `checkpoint.on_trainer_failure` is "restore", else its death is `TrainerLost`.
A trainer gang (`mesh.trainer_procs` > 1) is one role: one rank that dies, or hangs until its peers'
collectives time out (`GangError`, after `trainer.collective_timeout_s`), restarts all of them.
A generator that a refresh left torn (`weights.refresh.TornWeights`: a load failed part way) is replaced as
a dead one is: its fresh procs load a whole version, and the call is issued again.

`Supervised` is a part of `fleet.fleet.Roles` (it uses the role meshes, specs and versions Roles keeps).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from monarch.actor import ActorError

from forge_nb.actors.generator import Generator
from forge_nb.actors.reference import Reference
from forge_nb.actors.trainer import LossFailed, Trainer
from forge_nb.engines.base import WeightsRefused
from forge_nb.fleet.checker import ROLE as CHECKER
from forge_nb.fleet.envs import ROLE as ENV
from forge_nb.fleet.judges import ROLE as JUDGE
from forge_nb.parallel.gang import GangError
from forge_nb.runtime import last_words, supervision
from forge_nb.runtime.calls import gang_call, on_gang, wait
from forge_nb.runtime.supervision import SupervisionError
from forge_nb.weights.refresh import RefreshError, TornWeights


class TrainerLost(RuntimeError):
    """The trainer's proc died; its weights and optimizer state went with it."""


class CheckpointLost(RuntimeError):
    """The trainer died while it wrote a checkpoint: it was restarted (from the checkpoint before, or
    `TrainerLost`) and this checkpoint was not written."""


class Supervised:
    """Healing, respawning and re-issuing, for `Roles`."""

    def _trainer_saves(self, call: Callable[[], Any]) -> Any:
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

    def _supervised(self, role: str, call: Callable[[], Any], since: float | None = None) -> Any:
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
                said = _said_by_forge_nb(e)
                if said is e:
                    raise
                raise said from e
            with self._recovering:
                if self._respawned_at.get(lost, 0.0) < started:  # else another thread has just respawned it
                    self.respawn(lost, cause_of(e))
            return call()

    def heal(self) -> None:
        """Start afresh every role whose proc Monarch reported dead since it was last started."""
        with self._recovering:  # an async run heals from two threads: each dead role is respawned once
            faults = supervision.FAULTS.since(self._faults_seen)
            self._faults_seen += len(faults)
            for fault in faults:
                if fault.role in self.info and fault.time > self._respawned_at.get(fault.role, 0.0):
                    self.respawn(fault.role, fault.message.splitlines()[-1].strip())

    def respawn(self, role: str, cause: str) -> None:
        """Replace `role`'s procs and bring the new actors to where the old ones were."""
        with self._recovering:
            self._respawn(role, cause)

    def _respawn(self, role: str, cause: str) -> None:
        cause = last_words.with_words(cause, self.local_pids(role))  # why a proc of this host ended itself
        check_hosts = getattr(self.mesh, "check_hosts", None)
        if check_hosts is not None:  # several hosts: one that is gone is reported, not started on again
            check_hosts(role)
        if role == "trainer":
            return self._restore_trainer(cause)
        old = self.local_pids(role)
        self._respawned_at[role] = time.time()
        if role == "reward":
            return self.replace_rewards(f"respawned after {cause}")
        if role == CHECKER:
            return self.checker.replace(f"respawned after {cause}")
        if role == JUDGE:
            return self.judges.respawn(cause)
        if role == ENV:
            self.envs.start()
            return self.on_event(role, f"procs {old} died ({cause}); respawned as {self.pids[role]}")
        if role == "reference":
            # killed first: it holds frozen weights only, and a hung rank would hold a clean stop
            self.reference = self.mesh.replace(
                role, Reference, self._reference_spec, old, self.trainer_procs, kill=True
            )
            self.info[role] = wait(gang_call(self.reference, "ready"))
        elif role == "generator":
            self._respawn_generator(old)
        self.on_event(role, f"procs {old} died ({cause}); respawned as {self.pids[role]}")

    def _restore_trainer(self, cause: str) -> None:
        """A new trainer from the last checkpoint (checkpoint.on_trainer_failure="restore"), the
        generators attached to its weights; else `TrainerLost`."""
        checkpoint = self.restore_from() if self.restore_from is not None else None
        if checkpoint is None:
            how = "" if self.restore_from else " (or set checkpoint.on_trainer_failure='restore' and checkpoint.every)"
            raise TrainerLost(
                f"the trainer's proc died ({cause}) with the weights and optimizer state of policy version "
                f"{self.versions.trained}; start again from a checkpoint: forge_nb.resume(path){how}"
            )
        old, lost = self.local_pids("trainer"), self.versions.trained
        self._respawned_at["trainer"] = time.time()
        spec = dataclasses.replace(self._trainer_spec, resume_from=str(Path(checkpoint) / "trainer"))
        # killed first: a rank that died left its peers' group unusable, and one hung holds a clean stop
        self.trainer = self.mesh.replace("trainer", Trainer, spec, old, self.trainer_procs, kill=True)
        self.info["trainer"] = wait(gang_call(self.trainer, "ready"))
        self.versions.trained = on_gang(self.trainer, "checksum")[0]
        self._attach_generators(self.transport)
        self._refresh(self.versions.trained)
        self.on_event(
            "trainer",
            f"procs {old} died ({cause}) at policy v{lost}; restored v{self.versions.trained} from {checkpoint}",
        )

    def _respawn_generator(self, old: list[int]) -> None:
        """New generators, attached to the published weights and refreshed to the version served."""
        spec = self._generator_spec
        self.generator = self.mesh.replace("generator", Generator, spec, old, procs=self.generator_procs)
        self.info["generator"] = list(wait(self.generator.ready.call()).values())
        self.envs.attach_generator()
        # The /dev/shm names were dropped once the first generators mapped them: a new one reads over RDMA.
        self._attach_generators("rdma" if self.transport == "shm" else self.transport)
        try:
            self._refresh(self.versions.served)
        except ActorError as e:
            if not isinstance(e.exception, RefreshError):
                raise
            # The trainer published two versions since (async): that one is overwritten; serve the newest.
            self._refresh(self.versions.trained)


def innermost(error: BaseException) -> BaseException:
    """The exception a proc raised, through Monarch's wrappers (a call an env proc made to a generator
    comes wrapped twice)."""
    while isinstance(error, ActorError) and isinstance(error.exception, BaseException) and error.exception is not error:
        error = error.exception
    return error


def _said_by_forge_nb(error: SupervisionError | ActorError) -> BaseException:
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
