"""Registry of every live-code version: what it changed, the whole live set, and how validation went.

Rewards are a set of named members, each with a weight (the trained reward is their weighted sum;
weight 0 logs a member without training on it). Every change -- new code for a member, a new
weight, a member removed -- is one new reward version, recorded with the full set it makes live, so
a sample's `reward_version` says exactly what scored it and a rollback restores a whole set. The
loss is a set of one member, "loss".
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, field
from typing import TYPE_CHECKING

from forge_nb.live.capture import LiveCode

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is made: not in every proc that imports this module


@dataclass(frozen=True)
class Member:
    """One named reward (or the loss) in a live set: its code and weight."""

    code: LiveCode
    weight: float = 1.0


@dataclass
class VersionRecord:
    """One submitted change. Rejected candidates are kept too, with `version` None and no members; `candidate` is
    the version they were tried as (the number their error names; the next accepted change gets it).

    `name` is the member the change is about and `code` its code; `members` is the whole live set
    this version makes live."""

    kind: str
    version: int | None
    name: str
    code: LiveCode
    status: str  # "live", "retired" or "rejected"
    members: dict[str, Member] = field(default_factory=dict)
    validation: dict = field(default_factory=dict)  # seconds, probe size, error
    created: float = field(default_factory=time.time)
    change: str = "code"  # "code", "weight", "removed" or "builtin"
    candidate: int | None = None  # a rejected change: the version it was tried as

    @property
    def weight(self) -> float | None:
        member = self.members.get(self.name)
        return None if member is None else member.weight


class Registry:
    """Versions per kind. Version 0 of each kind is the built-in set the session starts with."""

    def __init__(self) -> None:
        self.records: list[VersionRecord] = []
        self._live: dict[str, int] = {}

    def add_builtin(self, kind: str, name: str, code: LiveCode) -> VersionRecord:
        return self._add(
            VersionRecord(kind, 0, name, code, "live", {name: Member(code)}, {"builtin": True}, change="builtin")
        )

    def next_version(self, kind: str) -> int:
        versions = [r.version for r in self.records if r.kind == kind and r.version is not None]
        return max(versions, default=-1) + 1

    def members(self, kind: str) -> dict[str, Member]:
        """The live set of `kind`."""
        return dict(self.live(kind).members)

    def propose(self, kind: str, name: str, code: LiveCode | None, weight: float | None) -> dict[str, Member]:
        """The set that would be live after changing member `name` (new code and / or weight; code None
        keeps the member's code, weight None its weight, 1.0 for a new member)."""
        members = self.members(kind)
        old = members.get(name)
        if code is None and old is None:
            raise KeyError(f"no {kind} member {name!r}; live members: {sorted(members)}")
        members[name] = Member(code or old.code, weight if weight is not None else (old.weight if old else 1.0))
        return members

    def accept(
        self, kind: str, name: str, members: dict[str, Member], validation: dict, change: str = "code"
    ) -> VersionRecord:
        """Record `members` as the next version and make it live."""
        code = members[name].code if name in members else self.live(kind).members[name].code
        record = VersionRecord(kind, self.next_version(kind), name, code, "live", members, validation, change=change)
        return self._add(record)

    def reject(
        self, kind: str, name: str, code: LiveCode, validation: dict, candidate: int | None = None
    ) -> VersionRecord:
        record = VersionRecord(kind, None, name, code, "rejected", {}, validation, candidate=candidate)
        self.records.append(record)
        return record

    def _add(self, record: VersionRecord) -> VersionRecord:
        self.records.append(record)
        self.make_live(record.kind, record.version)
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

    def to_records(self) -> dict:
        """Every record and which version of each kind is live, as JSON-able data (for checkpoints)."""
        records = []
        for r in self.records:
            members = {n: {"code": asdict(m.code), "weight": m.weight} for n, m in r.members.items()}
            records.append({**asdict(r), "code": asdict(r.code), "members": members})
        return {"records": records, "live": dict(self._live)}

    @classmethod
    def from_records(cls, data: dict) -> Registry:
        registry = cls()
        for r in data["records"]:
            members = {n: Member(_code(m["code"]), m["weight"]) for n, m in r["members"].items()}
            registry.records.append(VersionRecord(**{**r, "code": _code(r["code"]), "members": members}))
        registry._live = dict(data["live"])
        return registry

    def to_pandas(self, kind: str | None = None) -> pd.DataFrame:
        import pandas as pd

        rows = [
            {
                "kind": r.kind,
                "version": r.version,
                "status": r.status,
                "tried_as": r.candidate,  # a rejected change: the version its error named (the next one gets it)
                "member": r.name,
                "change": r.change,
                "weight": r.weight,
                "members": ", ".join(f"{n} x{m.weight:g}" for n, m in r.members.items()),
                "function": r.code.name,
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
            df["version"] = df["version"].astype("Int64")  # rejected changes have none: see tried_as
            df["tried_as"] = df["tried_as"].astype("Int64")
        return df


def _code(fields: dict) -> LiveCode:
    return LiveCode(**{**fields, "paths": tuple(fields["paths"]), "reload": tuple(fields["reload"])})
