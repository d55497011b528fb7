"""Registry of every live-code version: its source, when it was made, and how validation went."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import pandas as pd

from forge_nb.live.capture import LiveCode


@dataclass
class VersionRecord:
    """One submitted reward or loss. Rejected candidates are kept too, with `version` None."""

    kind: str
    version: int | None
    code: LiveCode
    status: str  # "live", "retired" or "rejected"
    validation: dict = field(default_factory=dict)  # seconds, probe size, error
    created: float = field(default_factory=time.time)


class Registry:
    """Versions per kind. Version 0 of each kind is the built-in one the session starts with."""

    def __init__(self) -> None:
        self.records: list[VersionRecord] = []
        self._live: dict[str, int] = {}

    def add_builtin(self, kind: str, code: LiveCode) -> VersionRecord:
        return self._accept(kind, 0, code, {"builtin": True})

    def next_version(self, kind: str) -> int:
        versions = [r.version for r in self.records if r.kind == kind and r.version is not None]
        return max(versions, default=-1) + 1

    def accept(self, kind: str, code: LiveCode, validation: dict) -> VersionRecord:
        return self._accept(kind, self.next_version(kind), code, validation)

    def _accept(self, kind: str, version: int, code: LiveCode, validation: dict) -> VersionRecord:
        record = VersionRecord(kind, version, code, "live", validation)
        self.records.append(record)
        self.make_live(kind, version)
        return record

    def reject(self, kind: str, code: LiveCode, validation: dict) -> VersionRecord:
        record = VersionRecord(kind, None, code, "rejected", validation)
        self.records.append(record)
        return record

    def make_live(self, kind: str, version: int) -> VersionRecord:
        """Mark `version` live (rollback or roll forward); the previously live one is retired."""
        record = self.get(kind, version)
        for r in self.records:
            if r.kind == kind and r.status == "live":
                r.status = "retired"
        record.status = "live"
        self._live[kind] = version
        return record

    def live(self, kind: str) -> VersionRecord:
        return self.get(kind, self._live[kind])

    def get(self, kind: str, version: int) -> VersionRecord:
        for r in self.records:
            if r.kind == kind and r.version == version:
                return r
        known = [r.version for r in self.records if r.kind == kind and r.version is not None]
        raise KeyError(f"no {kind} version {version}; known versions: {known}")

    def to_pandas(self, kind: str | None = None) -> pd.DataFrame:
        rows = [
            {
                "kind": r.kind,
                "version": r.version,
                "status": r.status,
                "name": r.code.name,
                "origin": r.code.origin,
                "created": pd.Timestamp(r.created, unit="s"),
                "validation_s": r.validation.get("seconds"),
                "error": r.validation.get("error"),
                "source": r.code.source,
            }
            for r in self.records
            if kind is None or r.kind == kind
        ]
        df = pd.DataFrame(rows)
        if not df.empty:
            df["version"] = df["version"].astype("Int64")  # rejected candidates have none
        return df
