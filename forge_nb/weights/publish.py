"""Trainer side of a weight refresh: snapshot the parameters into one registered flat buffer.

The buffer is allocated and registered with Monarch RDMA once; each publish copies the current
parameters into it (a memcpy) and returns a manifest carrying the version. Readers copy from the
snapshot, never from live parameters, so the optimizer may step as soon as `publish` returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch

from forge_nb.weights.manifest import WeightManifest, layout, views


class WeightPublisher:
    """Owns the flat snapshot of one model's parameters and its RDMA registration."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.slots, self.nbytes = layout(named_tensors)
        self.flat = torch.zeros(self.nbytes, dtype=torch.uint8)
        self._buffer = None
        self.version: int | None = None

    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> WeightManifest:
        """Copy `named_tensors` into the snapshot and describe it as `version`."""
        if version != self.version:
            targets = dict(views(self.flat, self.slots))
            with torch.no_grad():
                for name, t in named_tensors:
                    targets[name].copy_(t)
            self.version = version
        return WeightManifest(version, self.slots, self.nbytes, self._rdma_buffer())

    def _rdma_buffer(self):
        if self._buffer is None:
            from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

            with warnings.catch_warnings():
                # Without ibverbs Monarch moves the bytes over TCP; the refresh report shows the rate.
                warnings.simplefilter("ignore", RDMATcpFallbackWarning)
                self._buffer = RDMABuffer(self.flat)
        return self._buffer
