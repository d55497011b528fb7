"""The one owner of the weights between trainer and generators: attaching every generator to what the trainer
publishes, refreshing them to a version, and the session's record of policy versions (`versions.PolicyVersions`),
which nothing else writes.

A trainer rank publishes each version into its own snapshot (`weights.publish`); a generator replica reads every
rank's (`weights.refresh.WeightReceiver`) over the transport chosen where the two ends live: CUDA IPC on a shared
GPU, /dev/shm on one host, TCP streams or Monarch RDMA buffers across hosts, or a broadcast group ("group": each
trainer rank opens a group with every replica and serves it from a thread; a refresh is the replicas asking for a
version and receiving it, while the trainer's next step goes on).
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from forge_nb.config import WeightsConfig
from forge_nb.runtime.calls import gang_call, on_gang, replica, wait
from forge_nb.versions import PolicyVersions
from forge_nb.weights.manifest import WeightManifest
from forge_nb.weights.refresh import RefreshReport

if TYPE_CHECKING:
    from forge_nb.fleet.fleet import Fleet


class WeightSync:
    """Attach and refresh for `fleet`'s generators, and the policy versions: `published` when the trainer publishes
    one (a train step, a restored trainer), `refresh` when the generators load one."""

    def __init__(self, fleet: Fleet, versions: PolicyVersions, config: WeightsConfig) -> None:
        self.fleet, self.versions, self.config = fleet, versions, config
        self.transport = config.transport  # what the config asks for ("auto", "shm", "group", ...)
        self.chosen: str | None = None  # what the generators took, once attached

    def published(self, version: int) -> None:
        """The trainer published `version` (after a batch, or as a restored trainer's)."""
        self.versions.trained = version

    def attach(self, transport: str | None = None) -> str:
        """Every generator maps every trainer rank's snapshot (their manifests), then the /dev/shm names are
        dropped, so nothing can leak after (a later reader takes RDMA) -> the transport(s) chosen."""
        fleet = self.fleet
        transport = transport or self.transport
        ranks = wait(gang_call(fleet.trainer, "weights_manifest"))  # each rank publishes its own shards
        manifests = [self._with_stream_options(m) for m in ranks]
        if transport == "group":
            self.chosen = self._attach_group(manifests)
            return self.chosen
        chosen = set(wait(fleet.generator.attach.call(manifests, transport)).values())
        on_gang(fleet.trainer, "unlink_shared_memory")
        # Every reader on the trainer's GPU snapshots: the trainer stops copying versions to host memory;
        # none of them there: it frees them.
        on_gang(fleet.trainer, "host_snapshots", chosen != {"cuda_ipc"})
        if not any("cuda_ipc" in c for c in chosen):
            on_gang(fleet.trainer, "drop_gpu_snapshots")
        self.chosen = "+".join(sorted(chosen))
        return self.chosen

    def reattach(self) -> None:
        """Fresh generators (or a fresh trainer) attached again. The /dev/shm names were dropped once the first
        generators mapped them: a new reader takes RDMA instead."""
        self.attach("rdma" if self.transport == "shm" else self.transport)

    def _attach_group(self, manifests: list[WeightManifest]) -> str:
        """Every trainer rank's group, joined by the ranks and the replicas at once -> "group". NCCL when the
        trainer and every replica run on GPUs, else gloo."""
        fleet, replicas = self.fleet, self.fleet.generator_procs
        # Every replica's check first: one that refuses the weights would leave the others waiting in the group.
        wait(fleet.generator.fits.call(manifests))
        devices = [i.details.get("device", "cpu") for role in ("trainer", "generator") for i in fleet.info[role]]
        backend = "nccl" if all(d.startswith("cuda") for d in devices) else "gloo"
        specs = wait(gang_call(fleet.trainer, "weights_group", replicas, self.config.group_timeout_s, backend))
        manifests = [dataclasses.replace(m, group=spec) for m, spec in zip(manifests, specs)]
        joined = gang_call(fleet.trainer, "join_weights_group")
        generator = fleet.generator
        attached = [replica(generator, i, replicas).attach.call_one(manifests, "group", i + 1) for i in range(replicas)]
        chosen = {wait(f) for f in attached}
        wait(joined)
        on_gang(fleet.trainer, "unlink_shared_memory")
        # gloo sends the host snapshots; NCCL the GPU ones, and then the trainer needs no host copy.
        on_gang(fleet.trainer, "host_snapshots", backend != "nccl")
        if backend != "nccl":
            on_gang(fleet.trainer, "drop_gpu_snapshots")
        return "+".join(sorted(chosen))

    def refresh(self, version: int | None = None) -> RefreshReport:
        """Every generator replica loads `version` (default: the trainer's latest), in parallel -> their combined
        report; the served version is what they load. A replica that serves it whole already skips it
        (`WeightReceiver.needs`); over a broadcast group the replicas refresh or skip together."""
        fleet = self.fleet
        version = self.versions.trained if version is None else version
        if self.transport == "group":
            if not any(wait(fleet.generator.needs.call(version)).values()):
                return RefreshReport(version, version, 0, 0.0, 0.0, True, "group", fleet.generator_procs)
        report = RefreshReport.combine(list(wait(fleet.generator.refresh.call(version)).values()))
        self.versions.served = report.version
        return report

    def _with_stream_options(self, manifest: WeightManifest) -> WeightManifest:
        """The trainer says where it serves its TCP streams; the config says how generators read them; the
        session gives them the secret the streams ask for (which the trainer never sends back)."""
        if manifest.stream is None:
            return manifest
        c = self.config
        stream = dataclasses.replace(
            manifest.stream, streams=c.streams, timeout_s=c.stream_timeout_s, secret=self.fleet.stream_secret
        )
        return dataclasses.replace(manifest, stream=stream)
