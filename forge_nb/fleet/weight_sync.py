"""The session's side of the "group" weights transport (`weights.group`): each trainer rank opens a broadcast
group with every generator replica and serves it from a thread; a refresh is the replicas asking for a version
and receiving it (the trainer's actor is not called: its next step goes on meanwhile)."""

from __future__ import annotations

import dataclasses
from typing import Any

from forge_nb.runtime.calls import gang_call, on_gang, replica, wait
from forge_nb.weights.manifest import WeightManifest
from forge_nb.weights.refresh import RefreshReport


def attach(roles: Any, manifests: list[WeightManifest]) -> str:
    """Every trainer rank's group, joined by the ranks and the replicas at once -> "group". NCCL when the
    trainer and every replica run on GPUs, else gloo. `roles` is the session's `fleet.fleet.Roles`."""
    replicas, config = roles.generator_procs, roles.weights_config
    # Every replica's check first: one that refuses the weights would leave the others waiting in the group.
    wait(roles.generator.fits.call(manifests))
    devices = [i.details.get("device", "cpu") for role in ("trainer", "generator") for i in roles.info[role]]
    backend = "nccl" if all(d.startswith("cuda") for d in devices) else "gloo"
    specs = wait(gang_call(roles.trainer, "weights_group", replicas, config.group_timeout_s, backend))
    manifests = [dataclasses.replace(m, group=spec) for m, spec in zip(manifests, specs)]
    joined = gang_call(roles.trainer, "join_weights_group")
    generator = roles.generator
    attached = [replica(generator, i, replicas).attach.call_one(manifests, "group", i + 1) for i in range(replicas)]
    chosen = {wait(f) for f in attached}
    wait(joined)
    on_gang(roles.trainer, "unlink_shared_memory")
    # gloo sends the host snapshots; NCCL the GPU ones, and then the trainer needs no host copy.
    on_gang(roles.trainer, "host_snapshots", backend != "nccl")
    if backend != "nccl":
        on_gang(roles.trainer, "drop_gpu_snapshots")
    return "+".join(sorted(chosen))


def refresh(roles: Any, version: int) -> RefreshReport:
    """Every replica asks for `version` and receives it from every trainer rank -> their combined report.
    Skipped when every replica serves `version` already (a broadcast needs them all, so they refresh or skip
    together: a replica respawned since serves its start version and makes all of them refresh)."""
    served = set(wait(roles.generator.served.call()).values())
    if served == {version}:
        return RefreshReport(version, version, 0, 0.0, 0.0, True, "group", roles.generator_procs)
    report = RefreshReport.combine(list(wait(roles.generator.refresh.call(version)).values()))
    roles.versions.served = report.version
    return report
