"""Which torch device a proc's model runs on, decided in the proc (it sees only the GPUs its placement
gave it: ``CUDA_VISIBLE_DEVICES``, `forge_nb.launch.placement`)."""

from __future__ import annotations

import os

import torch


def resolve_device(asked: str) -> torch.device:
    """`asked` ("auto", "cpu", "cuda") in this proc: "auto" is CUDA when this proc sees a GPU. A proc
    that sees several takes the one at its LOCAL_RANK (a plan gives each trainer proc exactly one)."""
    if asked == "cpu" or (asked == "auto" and not torch.cuda.is_available()):
        return torch.device("cpu")
    index = int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count()
    torch.cuda.set_device(index)
    return torch.device("cuda", index)
