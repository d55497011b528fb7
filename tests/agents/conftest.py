"""Shared fixtures of the agents tests: the real SmolLM2 tokenizer, and a scripted backend for the
unit tests of masks and batching (the end-to-end tests use the real torch engine)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from forge_nb.engines.base import Completion, SamplingParams
from forge_nb.models.registry import resolve_model

SCRIPTED_LOGPROB = -0.25


@pytest.fixture(scope="session")
def smollm2_dir():
    return resolve_model("smollm2-135m-instruct")  # materialised once (~30 s) into the cache


@pytest.fixture(scope="session")
def tokenizer(smollm2_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(smollm2_dir))


@pytest.fixture(scope="session")
def smollm2_engine(smollm2_dir):
    from forge_nb.engines.torch_engine import TorchEngine

    torch.set_num_threads(1)
    return TorchEngine.load(smollm2_dir)


class ScriptedBackend:
    """A backend whose reply to a prompt is `reply(prompt_text)`, tokenised, ending with EOS (or cut at
    max_tokens without it); each token's logprob is `SCRIPTED_LOGPROB`. Records every batch it gets."""

    def __init__(self, tokenizer, reply: Callable[[str], str]) -> None:
        self.tokenizer, self.reply = tokenizer, reply
        self.batches: list[list[list[int]]] = []
        self.outputs: dict[tuple[int, ...], list[int]] = {}

    def __call__(self, prompt_ids: list[list[int]], sampling: SamplingParams) -> list[Completion]:
        self.batches.append([list(p) for p in prompt_ids])
        out = []
        for ids in prompt_ids:
            text = self.reply(self.tokenizer.decode(ids))
            tokens = self.tokenizer(text, add_special_tokens=False)["input_ids"] + [self.tokenizer.eos_token_id]
            reason = "stop"
            if len(tokens) > sampling.max_tokens:
                tokens, reason = tokens[: sampling.max_tokens], "length"
            self.outputs[tuple(ids)] = tokens
            shown = self.tokenizer.decode(tokens, skip_special_tokens=True)
            out.append(Completion(list(ids), tokens, [SCRIPTED_LOGPROB] * len(tokens), shown, reason))
        return out


def multiply(a: int, b: int) -> int:
    """Multiply two integers.

    Args:
        a: The first factor.
        b: The second factor.
    """
    return a * b


def add(a: int, b: int) -> int:
    """Add two integers.

    Args:
        a: The first number.
        b: The second number.
    """
    return a + b
