"""Generator side of a weight refresh: pull a published version over RDMA and load it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from forge_nb.weights.manifest import WeightManifest, views


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh did. `seconds` covers the transfer and the load; GB/s is bytes / seconds."""

    version: int
    previous_version: int
    bytes: int
    seconds: float
    transfer_seconds: float
    skipped: bool

    @property
    def gbps(self) -> float:
        return self.bytes / self.seconds / 1e9 if self.seconds > 0 and not self.skipped else 0.0

    def as_dict(self) -> dict:
        return {**self.__dict__, "gbps": self.gbps}


class WeightReceiver:
    """Tracks the version a generator serves and refreshes it from `WeightManifest`s."""

    def __init__(self, version: int = 0) -> None:
        self.version = version
        self._staging: torch.Tensor | None = None

    async def refresh(
        self, manifest: WeightManifest, load: Callable[[Iterable[tuple[str, torch.Tensor]]], None]
    ) -> RefreshReport:
        """Read `manifest`'s bytes into a staging buffer, then `load` the named views of it.

        A refresh to the version already served moves nothing and reports ``skipped=True``.
        """
        previous = self.version
        if manifest.version == previous:
            return RefreshReport(previous, previous, 0, 0.0, 0.0, True)
        start = time.perf_counter()
        if self._staging is None or self._staging.numel() != manifest.nbytes:
            self._staging = torch.empty(manifest.nbytes, dtype=torch.uint8)
        await manifest.buffer.read_into(self._staging)
        transferred = time.perf_counter()
        load(views(self._staging, manifest.slots))
        self.version = manifest.version
        end = time.perf_counter()
        return RefreshReport(manifest.version, previous, manifest.nbytes, end - start, transferred - start, False)
