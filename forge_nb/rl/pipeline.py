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

import torch

from forge_nb.rewards.batch import RewardBatch, Scores
from forge_nb.rl.advantages import decoupled, group_relative, informative_groups, overlong_penalty
from forge_nb.rl.completion import Completion
from forge_nb.rl.episode import Episode
from forge_nb.tasks.base import Problem


class EmptyTrainBatch(ValueError):
    """Every sample of a rollout failed its reward: there is nothing to train on."""


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
