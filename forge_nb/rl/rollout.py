"""A rollout: one batch of P prompts x G samples, scored, with group-relative advantages (`Rollout`).

The step makes it (`forge_nb.step.rollout`, with the pure pieces of `rl.pipeline`) and trains on it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

from forge_nb.rl.episode import Episode

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is made: not in every proc that imports this module


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
        """The mean reward of the samples a reward scored (`Episode.scored`; TRL's nanmean), NaN if none
        was: a failed sample's reward is NaN and an unscorable one's a placeholder 0, neither a score."""
        rewards = [e.reward for e in self.episodes if e.scored]
        return sum(rewards) / len(rewards) if rewards else math.nan

    @property
    def num_tokens(self) -> int:
        return sum(e.num_tokens for e in self.episodes)

    @property
    def tokens_per_s(self) -> float:
        """Tokens the policy generated (a trajectory's: its replies, not its tool results) per second."""
        generated = sum(e.trained_tokens for e in self.episodes)
        return generated / self.generate_s if self.generate_s > 0 else 0.0

    @property
    def agent_stats(self) -> dict[str, float]:
        """Mean model calls per trajectory and tool calls / errors in all; NaN in a batch of single-turn
        samples (no agent ran: a dashboard draws no agent panel)."""
        turns = [e.turns or [] for e in self.episodes]
        if not any(e.turns is not None for e in self.episodes):
            return dict.fromkeys(("turns", "tool_calls", "tool_errors"), math.nan)
        return {
            "turns": sum(max(1, len(t)) for t in turns) / max(1, len(turns)),
            "tool_calls": sum(x["tool_calls"] for t in turns for x in t),
            "tool_errors": sum(x["tool_errors"] for t in turns for x in t),
        }

    @property
    def truncated(self) -> float:
        """Share of completions cut off at max_tokens (no EOS, no stop string)."""
        return sum(e.finish_reason == "length" for e in self.episodes) / max(1, len(self.episodes))

    def summary(self) -> dict[str, float]:
        return {
            "policy_version": self.policy_version,
            "mean_reward": self.mean_reward,
            "accuracy": self.accuracy,
            "samples": len(self.episodes),
            "tokens": self.num_tokens,
            "tokens_per_s": self.tokens_per_s,
            "mean_tokens": self.num_tokens / len(self.episodes),
            "truncated": self.truncated,
            "generate_s": self.generate_s,
            "score_s": self.score_s,
            "reference_s": self.reference_s,
            **self.agent_stats,
        }

    def to_pandas(self) -> pd.DataFrame:
        """One row per sample: prompt, completion, target, reward, advantage, versions, ..."""
        import pandas as pd

        return pd.DataFrame([e.row() for e in self.episodes])

    def __repr__(self) -> str:
        return (
            f"Rollout({len(self.episodes)} samples, policy v{self.policy_version}, "
            f"mean reward {self.mean_reward:.3f}, {self.tokens_per_s:.0f} tokens/s)"
        )
