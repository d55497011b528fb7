"""The policy versions of a run, kept in one place in the kernel.

A policy version counts the trainer's optimizer steps: the trainer publishes version v + 1 after its
step from v; a generator serves the version it last refreshed to. Inside the actors the publisher
(`weights.publish.WeightPublisher`) and the receiver (`weights.refresh.WeightReceiver`) hold the truth;
in the kernel this object does. Only `fleet.weight_sync.WeightSync` writes it, as the actors' answers arrive
(a train step, a refresh, a restored trainer, a resume); everything else reads it.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class PolicyVersions:
    """`trained`: the version the trainer published last. `served`: the version every generator
    replica serves (they always agree). `trained - served` is how far the generator lags."""

    trained: int = 0
    served: int = 0

    @property
    def lag(self) -> int:
        return self.trained - self.served
