"""What a reward can read from a prompt as the model saw it: the question, and the numbers in it.

Rewards get the prompt with the chat template applied (system prompt, role markers); a judge or a
verifier wants the user's question. `question_of` takes the last user turn of the common chat
templates (ChatML as SmolLM2 and Qwen write it, Llama 3, Gemma), or the prompt itself.

A batched reward gets prompts and completions as TRL gives them (`rewards.trl_form`): chat
messages for a conversational dataset. `as_text` turns either form into text for the rewards here
that read text (the judge, the verifiers).
"""

from __future__ import annotations

import re
from functools import lru_cache
from typing import Any

_USER_TURNS = (
    re.compile(r"<\|im_start\|>user\n(.*?)<\|im_end\|>", re.DOTALL),  # ChatML
    re.compile(r"<\|start_header_id\|>user<\|end_header_id\|>\n\n(.*?)<\|eot_id\|>", re.DOTALL),  # Llama 3
    re.compile(r"<start_of_turn>user\n(.*?)<end_of_turn>", re.DOTALL),  # Gemma
)
_NUMBER = re.compile(r"(?<![\w.])-?\d+(?:,\d{3})*(?:\.\d+)?")


@lru_cache(maxsize=4096)  # a rollout has G samples of each prompt
def question_of(prompt: str) -> str:
    """The last user message of a chat-templated prompt, or the prompt stripped."""
    for turn in _USER_TURNS:
        found = turn.findall(prompt)
        if found:
            return found[-1].strip()
    return prompt.strip()


@lru_cache(maxsize=4096)
def numbers_in(text: str) -> tuple[float, ...]:
    """The numbers written in `text`, in order ("1,200" is 1200; "3.5" is 3.5)."""
    return tuple(float(n.replace(",", "")) for n in _NUMBER.findall(text))


def as_text(prompt_or_completion: Any) -> str:
    """Text of a prompt or completion as a batched reward gets it: a string as it is; chat messages
    -> the content of the last user message (a prompt), else of the last message (a completion)."""
    if isinstance(prompt_or_completion, str):
        return prompt_or_completion
    messages = list(prompt_or_completion)
    users = [m for m in messages if m.get("role") == "user"]
    return str((users or messages)[-1].get("content", "")) if messages else ""
