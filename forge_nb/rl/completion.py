"""What an engine returns for one sample, before it is scored: the record `rl.pipeline.make_episodes`
turns into an `Episode`. It lives in rl/, the package engines build on, so the pipeline that consumes
completions does not import the engines that make them."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Completion:
    """One sampled continuation of one prompt.

    `token_ids` are the generated ids (ending with EOS when `finish_reason == "stop"`);
    `logprobs[i]` is the sampling logprob of `token_ids[i]`; `text` excludes special tokens.
    """

    prompt_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    text: str
    finish_reason: str
