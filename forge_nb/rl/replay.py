"""Replay buffer: every scored episode with its provenance, bounded, newest last, each sample once."""

from __future__ import annotations

from collections import deque
from typing import TYPE_CHECKING

from forge_nb.rl.episode import Episode

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is made: not in every proc that imports this module


class DuplicateSample(ValueError):
    """A sample id that the buffer already holds (or held): adding it again would train on it twice."""


class ReplayBuffer:
    """Keeps the last `capacity` episodes; `added` counts every episode ever added. Sample ids are
    unique over the whole run (not only the window): a batch re-issued after a proc died cannot
    sneak in a second time."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._episodes: deque[Episode] = deque(maxlen=capacity)
        self._ids: set[int] = set()
        self.added = 0

    def add(self, episodes: list[Episode]) -> None:
        """Append `episodes`; `DuplicateSample` (and nothing added) if any id was added before."""
        ids = [e.sample_id for e in episodes]
        seen = self._ids.intersection(ids)
        if seen or len(set(ids)) != len(ids):
            repeated = sorted(seen) or sorted(i for i in set(ids) if ids.count(i) > 1)
            raise DuplicateSample(f"samples {repeated[:5]} are in the buffer already; not added again")
        self._ids.update(ids)
        self._episodes.extend(episodes)
        self.added += len(episodes)

    @classmethod
    def restored(cls, episodes: list[Episode], sample_ids: list[int], capacity: int = 10_000) -> ReplayBuffer:
        """A buffer holding `episodes`, that has seen `sample_ids` (a checkpoint's)."""
        buffer = cls(capacity)
        buffer._episodes.extend(episodes)
        buffer._ids, buffer.added = set(sample_ids), len(sample_ids)
        return buffer

    def sample_ids(self) -> list[int]:
        """Every sample id ever added, in order."""
        return sorted(self._ids)

    def recent(self, n: int) -> list[Episode]:
        return list(self._episodes)[-n:] if n > 0 else []

    def __len__(self) -> int:
        return len(self._episodes)

    def to_pandas(self, n: int | None = None) -> pd.DataFrame:
        import pandas as pd

        episodes = self.recent(n) if n is not None else list(self._episodes)
        return pd.DataFrame([e.row() for e in episodes])
