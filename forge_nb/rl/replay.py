"""Replay buffer: every scored episode with its provenance, bounded, newest last."""

from __future__ import annotations

from collections import deque

import pandas as pd

from forge_nb.rl.episode import Episode


class ReplayBuffer:
    """Keeps the last `capacity` episodes; `added` counts every episode ever added."""

    def __init__(self, capacity: int = 10_000) -> None:
        self._episodes: deque[Episode] = deque(maxlen=capacity)
        self.added = 0

    def add(self, episodes: list[Episode]) -> None:
        self._episodes.extend(episodes)
        self.added += len(episodes)

    def recent(self, n: int) -> list[Episode]:
        return list(self._episodes)[-n:] if n > 0 else []

    def __len__(self) -> int:
        return len(self._episodes)

    def to_pandas(self, n: int | None = None) -> pd.DataFrame:
        episodes = self.recent(n) if n is not None else list(self._episodes)
        return pd.DataFrame([e.row() for e in episodes])
