"""The rollout pipeline as pure functions: completions -> episodes -> scores -> advantages -> train subset.

The step (`forge_nb.step`: `rollout`, `score`, `advantages`, `train`) makes the actor calls
(generate, score, reference logprobs) and runs these in between; everything here is plain Python
and torch, tested without a mesh.

    episodes = make_episodes(problems, prompts, completions, policy_version, first_sample_id)
    batch = reward_batch(episodes, step)              # the columns the reward actors score, in shards
    errors = apply_scores(episodes[part], scores)     # each shard's `Scores` from the reward actors
    add_overlong_penalty(episodes, max_tokens, cache)  # DAPO, when configured
    assign_advantages(episodes, group_size, normalize_std, unbiased_std)  # weights=scores.weights: GDPO's
    train = train_subset(episodes, dynamic_sampling)   # what the trainer gets
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from forge_nb.rewards.batch import RewardBatch, Scores
from forge_nb.rl.advantages import decoupled, group_relative, informative_groups, overlong_penalty
from forge_nb.rl.completion import Completion
from forge_nb.rl.episode import Episode
from forge_nb.tasks.base import Problem

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is made: not in every proc that imports this module


class EmptyTrainBatch(ValueError):
    """Every sample of a rollout failed its reward: there is nothing to train on."""


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


def make_episodes(
    problems: Sequence[Problem],
    prompts: Sequence[str],
    completions: Sequence[Sequence[Completion]],
    policy_version: int,
    first_sample_id: int | None,
) -> list[Episode]:
    """Episodes in prompt-major order, numbered from `first_sample_id`; the group id of a prompt's
    samples is the id of its first one. `prompts` are the texts the model saw, one per problem.
    `first_sample_id=None` makes probe episodes (ids -1)."""
    episodes, next_id = [], first_sample_id
    for problem, prompt, group in zip(problems, prompts, completions):
        group_id = -1 if next_id is None else next_id
        for c in group:
            episodes.append(
                Episode(
                    sample_id=-1 if next_id is None else next_id,
                    group_id=group_id,
                    prompt_id=problem.prompt_id,
                    prompt=prompt,
                    completion=c.text,
                    target=problem.target,
                    prompt_ids=c.prompt_ids,
                    completion_ids=c.token_ids,
                    logprobs=c.logprobs,
                    finish_reason=c.finish_reason,
                    policy_version=policy_version,
                    extras=problem.extras,
                )
            )
            next_id = None if next_id is None else next_id + 1
    return episodes


def reward_batch(episodes: Sequence[Episode], step: int) -> RewardBatch:
    """The columns of `episodes` for the reward actors, scored at training step `step`."""
    return RewardBatch(
        [e.prompt for e in episodes],
        [e.completion for e in episodes],
        [e.target for e in episodes],
        [e.policy_version for e in episodes],
        [e.sample_id for e in episodes],
        [e.prompt_id for e in episodes],
        [e.extras for e in episodes],
        step,
        [e.completion_ids for e in episodes],
    )


def apply_scores(episodes: Sequence[Episode], scores: Scores) -> list[dict]:
    """Fill in each episode's reward and its members' scores (or its error, with reward NaN) from
    `scores`, which lines up with `episodes` -> one record per failed sample (the step keeps them in
    `state.RunState.reward_errors`)."""
    errors = []
    for i, e in enumerate(episodes):
        e.reward_version = scores.reward_version
        e.rewards = {name: values[i] for name, values in scores.components.items() if values[i] is not None}
        if i in scores.errors:
            e.reward, e.reward_error = float("nan"), scores.errors[i]
            errors.append(
                {
                    "sample_id": e.sample_id,
                    "reward_version": scores.reward_version,
                    "prompt": e.prompt,
                    "completion": e.completion,
                    "error": scores.errors[i],
                }
            )
        else:
            e.reward = scores.rewards[i]
    return errors


def add_overlong_penalty(episodes: Sequence[Episode], max_tokens: int, cache: int) -> None:
    """DAPO soft overlong punishment added to the reward of every scored episode (`Episode.scored`: not one
    whose reward failed, nor one no member scored, which is not trained on); it is kept in
    `Episode.rewards["overlong"]` beside the members' scores."""
    scored = [e for e in episodes if e.scored]
    if not scored:
        return
    penalty = overlong_penalty(torch.tensor([e.num_tokens for e in scored]), max_tokens, cache)
    for e, p in zip(scored, penalty.tolist()):
        e.rewards = {**e.rewards, "overlong": p}
        e.reward += p


def assign_advantages(
    episodes: Sequence[Episode],
    group_size: int,
    normalize_std: bool = True,
    unbiased_std: bool = True,
    std_over: str = "group",
    weights: dict[str, float] | None = None,
) -> None:
    """Group-relative advantages over consecutive groups of `group_size` episodes (prompt-major
    order). Episodes whose reward failed, or that no reward scored (every member gave None: TRL's "unscorable",
    whose weighted sum of nothing is 0), get advantage 0 and do not count in their group (nor in the batch's
    std with ``std_over="batch"``). With the members' `weights` (`Scores.weights`), GDPO's: each reward
    normalised in its group on its own, then summed (`decoupled`, `reward_components`), in place of
    `normalize_std` and `std_over`."""
    groups = len(episodes) // group_size
    if weights is not None:
        names, components = reward_components(episodes, weights)
        scale = torch.tensor([weights.get(n, 1.0) for n in names])
        advantages = decoupled(components.view(groups, group_size, len(names)), scale, unbiased=unbiased_std)
    else:
        valid = torch.tensor([e.scored for e in episodes]).view(groups, group_size)
        rewards = torch.tensor([e.reward for e in episodes]).view(groups, group_size)
        advantages = group_relative(rewards, normalize_std, valid=valid, unbiased=unbiased_std, std_over=std_over)
    advantages = advantages.flatten().tolist()
    for e, a in zip(episodes, advantages):
        e.advantage = a


def reward_components(episodes: Sequence[Episode], weights: dict[str, float]) -> tuple[list[str], torch.Tensor]:
    """Each episode's score under each reward it was trained on -> (the names, [N, K], NaN where none): the
    live members of nonzero weight (`weights`), or a trajectory's own reward ("rollout", which replaces them,
    as in `Episode.reward`), and DAPO's overlong penalty ("overlong", weight 1), each a reward of its own. A
    sample whose reward failed has none. No `weights`: every member of the episodes' scores, weight 1."""
    extra = [n for n in ("rollout", "overlong") if any(n in e.rewards for e in episodes)]
    if not weights:  # scores that did not say how they were weighted: each member its score, weight 1
        weights = {n: 1.0 for e in episodes for n in e.rewards if n not in extra}
    names = [n for n, w in weights.items() if w != 0] + extra
    rows = []
    for e in episodes:
        own = "rollout" in e.rewards  # its members' scores are kept beside it, not trained on
        rows.append(
            [
                math.nan if e.reward_error is not None or (own and n in weights) else e.rewards.get(n, math.nan)
                for n in names
            ]
        )
    return names, torch.tensor(rows, dtype=torch.float64).reshape(len(episodes), len(names))


def train_subset(episodes: Sequence[Episode], dynamic_sampling: bool = False, decoupled: bool = False) -> list[Episode]:
    """The episodes to train on: those that scored, minus the groups whose rewards are all equal
    when `dynamic_sampling` (DAPO) is on (`decoupled`, GDPO's advantages: whose every reward's scores are, as
    two samples whose weighted sums tie can differ there). May be empty then; raises `EmptyTrainBatch` when no
    episode scored at all."""
    scored = [e for e in episodes if e.reward_error is None]
    if not scored:
        raise EmptyTrainBatch("every sample of this rollout failed its reward; nothing to train on")
    if not dynamic_sampling:
        return scored
    groups: dict[int, list] = {}
    for e in scored:
        groups.setdefault(e.group_id, []).append(tuple(sorted(e.rewards.items())) if decoupled else e.reward)
    if decoupled:
        keep = {g for g, scores in groups.items() if len(set(scores)) > 1}
    else:
        keep = {g for g, informative in zip(groups, _informative(list(groups.values()))) if informative}
    return [e for e in scored if e.group_id in keep]


def _informative(rows: list[list[float]]) -> list[bool]:
    """`informative_groups` over groups of unequal size (failed samples are left out)."""
    width = max(len(r) for r in rows)
    padded = torch.tensor([r + [r[0]] * (width - len(r)) for r in rows])  # padding repeats a member: no new value
    return informative_groups(padded).tolist()
