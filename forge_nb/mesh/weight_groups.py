"""The session's side of the "group" weights transport (`weights.group`): each trainer rank opens a broadcast
group with every generator replica, and a refresh is one broadcast per rank, sent by the trainer while the
replicas receive (the other transports are pulled by the generators alone)."""

from __future__ import annotations

import dataclasses
from typing import Any

from forge_nb.mesh.calls import on_gang, replica, wait
from forge_nb.weights.manifest import WeightManifest
from forge_nb.weights.refresh import RefreshReport


def attach(roles: Any, manifests: list[WeightManifest]) -> str:
    """Every trainer rank's group, joined by the ranks and the replicas at once -> "group". `roles` is the
    session's `mesh.roles.Roles`."""
    replicas = roles.generator_procs
    specs = wait(roles.trainer.weights_group.call(replicas, roles.weights_config.group_timeout_s)).values()
    manifests = [dataclasses.replace(m, group=spec) for m, spec in zip(manifests, specs)]
    joined = roles.trainer.join_weights_group.call()
    generator = roles.generator
    attached = [replica(generator, i, replicas).attach.call_one(manifests, "group", i + 1) for i in range(replicas)]
    chosen = {wait(f) for f in attached}
    wait(joined)
    on_gang(roles.trainer, "unlink_shared_memory")
    # gloo sends the host snapshots; NCCL the GPU ones, and then the trainer needs no host copy.
    on_gang(roles.trainer, "host_snapshots", specs[0].backend != "nccl")
    return "+".join(sorted(chosen))


def refresh(roles: Any, version: int) -> RefreshReport:
    """Every trainer rank sends its snapshot of `version` while every replica receives and loads it -> the
    replicas' combined report. Skipped, both sides, when the replicas already serve `version`."""
    if version == roles.versions.served:
        return RefreshReport(version, version, 0, 0.0, 0.0, True, "group", roles.generator_procs)
    sent = roles.trainer.send_weights.call(version)
    report = RefreshReport.combine(list(wait(roles.generator.refresh.call(version)).values()))
    wait(sent)
    roles.versions.served = report.version
    return report
