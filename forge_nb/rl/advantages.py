"""Group-relative advantages (GRPO): each completion is compared with its siblings from one prompt."""

from __future__ import annotations

import torch


def group_relative(rewards: torch.Tensor, normalize_std: bool = True, eps: float = 1e-6) -> torch.Tensor:
    """rewards [P, G] (P prompts x G samples each) -> advantages [P, G].

    ``A = (r - mean_group(r)) / (std_group(r) + eps)``; with `normalize_std=False` only the mean is
    removed (Dr.GRPO). A group whose rewards are all equal gets advantage 0 everywhere.
    """
    centered = rewards - rewards.mean(dim=1, keepdim=True)
    if not normalize_std:
        return centered
    # Population std over the group (unbiased=False), so a group of one gives 0 rather than NaN.
    return centered / (rewards.std(dim=1, keepdim=True, unbiased=False) + eps)
