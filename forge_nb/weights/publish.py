"""Trainer side of a weight refresh: snapshot the parameters into one registered flat buffer.

The buffer is allocated and registered with Monarch RDMA once; each publish copies the current
parameters into it (a memcpy) and stamps the version in its header. Readers copy from the
snapshot, never from live parameters, so the optimizer may step as soon as `publish` returns.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterable

import torch

from forge_nb.weights.manifest import WeightManifest, layout, version_view, views


class WeightPublisher:
    """Owns the flat snapshot of one model's parameters and its RDMA registration."""

    def __init__(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int = 0) -> None:
        named = list(named_tensors)
        self.slots, self.nbytes = layout(named)
        self.flat = torch.zeros(self.nbytes, dtype=torch.uint8)
        self._targets = dict(views(self.flat, self.slots))
        self._buffer = None
        self.version: int | None = None
        self.publish(named, version)

    @torch.no_grad()
    def publish(self, named_tensors: Iterable[tuple[str, torch.Tensor]], version: int) -> None:
        """Copy `named_tensors` into the snapshot and stamp it as `version`."""
        if version == self.version:
            return
        for name, t in named_tensors:
            self._targets[name].copy_(t)
        version_view(self.flat).fill_(version)
        self.version = version

    def manifest(self) -> WeightManifest:
        """The layout and the RDMA handle (registered on first use)."""
        if self._buffer is None:
            from monarch.rdma import RDMABuffer, RDMATcpFallbackWarning

            with warnings.catch_warnings():
                # Without ibverbs Monarch moves the bytes over TCP; the refresh report shows the rate.
                warnings.simplefilter("ignore", RDMATcpFallbackWarning)
                self._buffer = RDMABuffer(self.flat)
        return WeightManifest(self.slots, self.nbytes, self._buffer)
