"""A rollout: one batch of scored episodes plus how long each phase took."""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from forge_nb.rl.episode import Episode


@dataclass
class Rollout:
    """`episodes` are P prompts x G samples, grouped by `group_id`; `accuracy` is the verifier's view.

    Times are seconds inside the actors; `tokens_per_s` is generated tokens / generation seconds.
    `reference_s` is how long the rollout still waited for the reference model's logprobs once
    scoring was done (they are computed while the reward procs score; 0 without a reference).
    """

    episodes: list[Episode]
    policy_version: int
    accuracy: float
    generate_s: float
    score_s: float
    reference_s: float = 0.0

    @property
    def mean_reward(self) -> float:
        return sum(e.reward for e in self.episodes) / len(self.episodes)

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.episodes)

    @property
    def tokens_per_s(self) -> float:
        return self.num_tokens / self.generate_s if self.generate_s > 0 else 0.0

    def summary(self) -> dict[str, float]:
        return {
            "policy_version": self.policy_version,
            "mean_reward": self.mean_reward,
            "accuracy": self.accuracy,
            "samples": len(self.episodes),
            "tokens": self.num_tokens,
            "tokens_per_s": self.tokens_per_s,
            "generate_s": self.generate_s,
            "score_s": self.score_s,
            "reference_s": self.reference_s,
        }

    def to_pandas(self) -> pd.DataFrame:
        """One row per sample: prompt, completion, target, reward, advantage, versions, ..."""
        return pd.DataFrame([e.row() for e in self.episodes])

    def __repr__(self) -> str:
        return (
            f"Rollout({len(self.episodes)} samples, policy v{self.policy_version}, "
            f"mean reward {self.mean_reward:.3f}, {self.tokens_per_s:.0f} tokens/s)"
        )
