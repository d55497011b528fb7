"""The policy's entropy on the tokens it trains on, taken from the forward an update runs anyway.

Entropy (nats per token, of the policy at ``logits / temperature``) is what TRL and verl log every step: its
fall shows a policy growing sure of itself, a collapse shows as a drop to ~0. Computing it needs every
vocabulary entry's probability, which only the logprob functions hold (`rl.prefix_batch.prefix_logprobs`,
`rl.batch.token_logprobs`); they `note` it for a caller that asked with `taking`, in chunks of rows so the extra
memory stays near `CHUNK_ELEMENTS` floats (on a 32k vocabulary, ~256 MB), or one row's [T, V] when that is more.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar

import torch

CHUNK_ELEMENTS = 1 << 26
_TAKING: ContextVar[list[torch.Tensor] | None] = ContextVar("forge_nb_entropy", default=None)


@contextmanager
def taking() -> Iterator[list[torch.Tensor]]:
    """Collect the per-token entropy [K, T] of each logprob forward run inside the block (in order)."""
    taken: list[torch.Tensor] = []
    token = _TAKING.set(taken)
    try:
        yield taken
    finally:
        _TAKING.reset(token)


@torch.no_grad()
def note(logp: torch.Tensor, mask: torch.Tensor) -> None:
    """`logp` [K, T, V] log-probabilities, `mask` [K, T]: their per-token entropy, 0 where masked out, for
    whoever is `taking` (nothing to do otherwise)."""
    taken = _TAKING.get()
    if taken is None:
        return
    rows, width, vocab = logp.shape
    step = max(1, CHUNK_ELEMENTS // max(1, width * vocab))
    out = torch.empty((rows, width), dtype=torch.float32, device=logp.device)
    for i in range(0, rows, step):
        # entr(p) = -p log p, 0 at p = 0: a token masked to -inf in the logits adds nothing (not NaN).
        out[i : i + step] = torch.special.entr(logp[i : i + step].detach().float().exp()).sum(-1)
    taken.append(out * mask)
