"""Generator side of a weight refresh: pull a published version over RDMA and load it."""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch

from forge_nb.weights.manifest import WeightManifest, version_view, views


class RefreshError(RuntimeError):
    """The bytes read do not hold the version that was asked for."""


@dataclass(frozen=True)
class RefreshReport:
    """What one refresh did. `seconds` covers transfer and load; GB/s is bytes / seconds (1e9 B)."""

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
    """Tracks the version a generator serves and refreshes it from one publisher's buffer."""

    def __init__(self, manifest: WeightManifest, version: int = 0) -> None:
        self.manifest = manifest
        self.version = version
        self._staging = torch.empty(manifest.nbytes, dtype=torch.uint8)

    async def refresh(self, version: int, load: Callable[[Iterable[tuple[str, torch.Tensor]]], None]) -> RefreshReport:
        """Read the published buffer, check it holds `version`, then `load` the named views.

        A refresh to the version already served moves nothing and reports ``skipped=True``.
        """
        previous = self.version
        if version == previous:
            return RefreshReport(previous, previous, 0, 0.0, 0.0, True)
        start = time.perf_counter()
        await self.manifest.buffer.read_into(self._staging)
        transferred = time.perf_counter()
        found = int(version_view(self._staging).item())
        if found != version:
            raise RefreshError(f"asked for policy version {version}, the published buffer holds {found}")
        load(views(self._staging, self.manifest.slots))
        self.version = version
        end = time.perf_counter()
        return RefreshReport(version, previous, self.manifest.nbytes, end - start, transferred - start, False)
