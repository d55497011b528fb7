"""The engine interface every generator backend implements.

``generate(prompts, sampling) -> completions with logprobs`` (`rl.completion.Completion`) and
``load_weights(named tensors)``.
A prompt is token ids (what the session sends: it renders chat templates itself) or a string, which
the engine tokenizes as its tokenizer does by default.
Logprobs are those of the *sampling* distribution: ``log_softmax(logits / temperature)`` at the
sampled token (temperature 1 when decoding greedily), before top-p truncation, so the trainer can
recompute them exactly from ``logits / temperature``.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Protocol

import torch

from forge_nb.rl.completion import Completion


@dataclass(frozen=True)
class SamplingParams:
    """How to sample. ``temperature == 0`` means greedy; `max_tokens` counts generated tokens.

    `stop`: strings that end a completion (finish_reason "stop"); the completion keeps the tokens up
    to the one that completes the string, its `text` ends before the string. `keep_prefix`: a hint
    that later prompts will extend these (an agent's next turn): the torch engine keeps their keys and
    values for them (`engines.prefix_cache`); vLLM's prefix cache does this for every prompt.
    `top_k`: sample among the k likeliest tokens only (0: all). `stop_token_ids`: tokens that end a completion
    besides EOS (kept in it, as EOS is); `ignore_eos`: EOS does not end one (Tinker's ``stop=[]``).
    """

    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    max_tokens: int = 8
    seed: int | None = None
    stop: tuple[str, ...] = ()
    keep_prefix: bool = False
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    ignore_eos: bool = False


Prompt = str | list[int]


def encode_prompts(tokenizer, prompts: Sequence[Prompt]) -> list[list[int]]:
    """Token ids of each prompt: ids as they are, strings through `tokenizer` (special tokens added)."""
    return [p if isinstance(p, list) else tokenizer(p)["input_ids"] for p in prompts]


class WeightsRefused(ValueError):
    """The tensors a trainer publishes do not fit the served model (a name it lacks, another shape): an
    engine's optional ``check_weights(shapes)`` says so when a generator attaches, before any load."""


class Engine(Protocol):
    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        """`sampling.n` completions for every prompt: result[i][j] is sample j of prompt i."""
        ...

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Teacher-forced logprobs (temperature 1) of each completion's tokens after its prompt."""
        ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the served weights (HF parameter names) in place, without a restart. An error may leave
        some tensors replaced: the receiver then holds the replica torn (`weights.refresh.TornWeights`)."""
        ...

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        """The weights being served now, under the engine's own names and layout."""
        ...


def cut_at_stop(text: str, stop: tuple[str, ...]) -> tuple[str, bool]:
    """-> (`text` up to the earliest stop string, whether one occurred)."""
    hits = [i for i in (text.find(s) for s in stop if s) if i >= 0]
    return (text[: min(hits)], True) if hits else (text, False)
