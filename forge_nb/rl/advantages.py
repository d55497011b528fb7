"""Group-relative advantages (GRPO): each completion is compared with its siblings from one prompt."""

from __future__ import annotations

import torch


def group_relative(
    rewards: torch.Tensor,
    normalize_std: bool = True,
    eps: float = 1e-6,
    valid: torch.Tensor | None = None,
    unbiased: bool = False,
    std_over: str = "group",
) -> torch.Tensor:
    """rewards [P, G] (P prompts x G samples each) -> advantages [P, G].

    ``A = (r - mean_group(r)) / (std_group(r) + eps)``; with `normalize_std=False` only the mean is
    removed (Dr.GRPO). A group whose rewards are all equal gets advantage 0 everywhere.
    ``std_over="batch"``: the std is one, of every valid reward of the batch (Lite PPO: a group's mean, the
    batch's std; TRL's ``scale_rewards="batch"``), so a group whose rewards barely differ is not blown up.
    `unbiased`: the sample std (Bessel, n - 1: TRL and verl) instead of the population std (n); the
    two differ by sqrt(n / (n - 1)), 1.07x for G = 8. A group of one has std 0 either way.
    `valid` [P, G] bool leaves samples out (a reward that failed on them): their advantage is 0 and
    they do not count in their group's mean and std.
    """
    valid = torch.ones_like(rewards, dtype=torch.bool) if valid is None else valid
    weights = valid.float()
    rewards = torch.where(valid, rewards, torch.zeros_like(rewards))
    count = weights.sum(dim=1, keepdim=True).clamp(min=1.0)
    mean = (rewards * weights).sum(dim=1, keepdim=True) / count
    centered = (rewards - mean) * weights
    if not normalize_std:
        return centered
    if std_over == "batch":
        total = weights.sum().clamp(min=1.0)
        return centered / (_std((rewards - (rewards * weights).sum() / total) * weights, total, unbiased) + eps)
    if std_over != "group":
        raise ValueError(f"std_over must be 'group' or 'batch', got {std_over!r}")
    return centered / (_std(centered, count, unbiased, dim=1) + eps)


def decoupled(
    components: torch.Tensor, weights: torch.Tensor, eps: float = 1e-4, unbiased: bool = True
) -> torch.Tensor:
    """GDPO (Group reward-Decoupled normalization Policy Optimization; TRL's
    ``multi_objective_aggregation="normalize_then_sum"``): components [P, G, K], each sample's score under each of K
    rewards (NaN: none: that reward did not score it, or the sample failed), weights [K] -> advantages [P, G].

    Each reward is normalised within each group on its own, ``(r_k - mean_group(r_k)) / (std_group(r_k) + eps)``
    (over the samples it scored), so a reward with a wide range does not drown a narrow one and two rewards'
    combinations that tie in their sum keep their difference; the weighted sum of those, then, is normalised over
    the batch, ``(s - mean(s)) / (std(s) + eps)``. A sample no reward scored gets 0 and counts in no statistic.
    `unbiased`: Bessel's n - 1 in each std (TRL's), where a std of a single value is undefined and its reward
    adds nothing to that sample; else the population std."""
    mean = torch.nanmean(components, dim=1, keepdim=True)
    normalized = (components - mean) / (_nanstd(components, 1, unbiased) + eps)
    scored = ~torch.isnan(components).all(dim=-1)
    summed = torch.where(scored, (normalized * weights).nansum(dim=-1), torch.nan)
    advantages = (summed - torch.nanmean(summed)) / (_nanstd(summed, None, unbiased) + eps)
    return torch.nan_to_num(advantages, nan=0.0)


def _nanstd(values: torch.Tensor, dim: int | None, unbiased: bool) -> torch.Tensor:
    """The std over `dim` (None: all) of the values that are not NaN (kept dims); NaN for fewer than 2 of them
    when `unbiased`, or none."""
    keep = dim is not None
    mean = torch.nanmean(values, dim=dim, keepdim=keep)
    count = (~torch.isnan(values)).sum(dim=dim, keepdim=keep)
    squares = torch.nansum((values - mean) ** 2, dim=dim, keepdim=keep)
    dof = count - 1 if unbiased else count
    return torch.where(dof > 0, squares / dof.clamp(min=1), torch.nan).sqrt()


def _std(deviations: torch.Tensor, count: torch.Tensor, unbiased: bool, dim: int | None = None) -> torch.Tensor:
    """The std of `count` values (>= 1) from their `deviations` from their mean (0 where left out), summed over
    `dim` (None: all), with Bessel's n - 1 when `unbiased` (a single value: 0 / 1, not NaN)."""
    dof = (count - 1).clamp(min=1.0) if unbiased else count
    squares = (deviations**2).sum() if dim is None else (deviations**2).sum(dim=dim, keepdim=True)
    return (squares / dof).sqrt()


def informative_groups(rewards: torch.Tensor) -> torch.Tensor:
    """DAPO dynamic sampling: rewards [P, G] -> keep [P] bool, False for groups whose rewards are all
    equal (their advantages are all 0, so they carry no gradient and only dilute the batch)."""
    return (rewards.max(dim=1).values - rewards.min(dim=1).values) > 0


def overlong_penalty(lengths: torch.Tensor, max_tokens: int, cache: int) -> torch.Tensor:
    """DAPO soft overlong punishment, added to the reward: lengths [N] -> penalty [N] in [-1, 0].

    0 up to ``max_tokens - cache`` tokens, then linear down to -1 at `max_tokens`, -1 beyond.
    """
    start = max_tokens - cache
    ramp = (start - lengths.float()) / max(cache, 1)
    return torch.where(lengths <= start, torch.zeros_like(ramp), ramp.clamp(min=-1.0))
