"""Keys and values kept across generate calls, so an agent's next turn prefills only what is new.

An agent's turn k+1 prompt is its turn-k prompt, the reply, and the new messages (`agents.trajectory`):
every token before the new messages was already run through the model by the previous call. The torch
engine keeps each row's keys and values after a call (the prompt and the reply's tokens that were fed
back), and a later prompt that extends a kept row prefills only its suffix. Kept rows belong to the
weights that made them: `clear()` at every weight load. Bounded by `max_bytes`, oldest rows dropped first.

Tensors per kept row and layer: keys / values [H_kv, L, D_head]. A batch of prompts with kept prefixes
of lengths L_i becomes one cache [B, H_kv, max L, D_head], each row's prefix right-aligned (left padding,
masked out), so the suffixes can follow it as one left-padded block.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence

import torch
from transformers.cache_utils import DynamicCache, DynamicLayer

Layers = list[tuple[torch.Tensor, torch.Tensor]]  # per model layer: (keys, values), each [H_kv, L, D_head]


class PrefixCache:
    """Per-row keys/values of recent calls, looked up by token prefix."""

    def __init__(self, max_bytes: int = 512 * 2**20) -> None:
        self.max_bytes = max_bytes
        self._rows: OrderedDict[tuple[int, ...], Layers] = OrderedDict()
        self._bytes = 0
        self.hits = 0  # prompts that reused a kept prefix, and the tokens they did not prefill
        self.tokens_saved = 0

    def clear(self) -> None:
        self._rows.clear()
        self._bytes = 0

    def longest_prefix(self, prompt: Sequence[int]) -> tuple[tuple[int, ...], Layers] | None:
        """The longest kept row that is a proper prefix of `prompt` (at least one token is left to prefill)."""
        best = None
        for tokens, layers in self._rows.items():
            if len(tokens) < len(prompt) and (best is None or len(tokens) > len(best[0])):
                if tuple(prompt[: len(tokens)]) == tokens:
                    best = (tokens, layers)
        return best

    def take(self, prompts: Sequence[Sequence[int]]) -> list[tuple[tuple[int, ...], Layers] | None]:
        """Each prompt's longest kept prefix (or None); counted in `hits` / `tokens_saved`."""
        found = [self.longest_prefix(p) for p in prompts]
        self.hits += sum(h is not None for h in found)
        self.tokens_saved += sum(len(h[0]) for h in found if h is not None)
        return found

    def keep(self, tokens: Sequence[int], layers: Layers) -> None:
        """Keep `layers` (keys/values of `tokens`, [H_kv, len(tokens), D_head] each) as the newest row."""
        key = tuple(tokens)
        if key in self._rows:
            self._drop(key)
        size = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if size > self.max_bytes:
            return
        self._rows[key] = layers
        self._bytes += size
        while self._bytes > self.max_bytes:
            self._drop(next(iter(self._rows)))

    def _drop(self, key: tuple[int, ...]) -> None:
        layers = self._rows.pop(key)
        self._bytes -= sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)


def supported(cache) -> bool:
    """Whether `cache` (a model's past_key_values) is plain full-attention layers this module can rebuild."""
    return type(cache) is DynamicCache and all(type(layer) is DynamicLayer for layer in cache.layers)


def batched(prefixes: Sequence[Layers | None], length: int) -> tuple[DynamicCache, torch.Tensor]:
    """Rows' kept layers (None: no prefix) -> a cache [B, H_kv, length, D_head] per layer, each row right-aligned,
    and its attention mask [B, length] (1 on kept positions)."""
    some = next(p for p in prefixes if p is not None)
    cache = DynamicCache()
    mask = torch.zeros((len(prefixes), length), dtype=torch.long)
    for i, layers in enumerate(prefixes):
        if layers is not None:
            mask[i, length - layers[0][0].shape[1] :] = 1
    for idx, (k0, v0) in enumerate(some):
        keys = k0.new_zeros((len(prefixes), k0.shape[0], length, k0.shape[2]))
        values = v0.new_zeros((len(prefixes), v0.shape[0], length, v0.shape[2]))
        for i, layers in enumerate(prefixes):
            if layers is not None:
                k, v = layers[idx]
                keys[i, :, length - k.shape[1] :] = k
                values[i, :, length - v.shape[1] :] = v
        cache.update(keys, values, idx)
    return cache, mask


def rows_of(cache: DynamicCache, mask: torch.Tensor, lengths: Sequence[int]) -> list[Layers]:
    """Each row's keys/values at its first `lengths[i]` unmasked positions (prompt, then the fed-back reply)."""
    out = []
    for i, n in enumerate(lengths):
        at = mask[i].nonzero()[:n, 0]
        out.append([(layer.keys[i].index_select(1, at), layer.values[i].index_select(1, at)) for layer in cache.layers])
    return out
