"""Monarch actors: thin adapters that hold state and call the plain-PyTorch modules."""

from __future__ import annotations

import torch


def setup_proc(threads: int) -> None:
    """Per-proc set-up every actor runs first: a torch thread budget, and no progress bars
    (an actor's stdout is forwarded to the controller; bars would interleave there)."""
    from transformers.utils import logging

    torch.set_num_threads(threads)
    logging.disable_progress_bar()
