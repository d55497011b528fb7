"""The keywords a batched reward is called with: those of TRL's GRPOTrainer, plus forge_nb's own.

TRL calls ``reward(prompts=..., completions=..., completion_ids=..., **dataset_columns,
trainer_state=..., log_extra=..., log_metric=...)`` (`GRPOTrainer._calculate_rewards`, trl 1.16).
For a conversational dataset (the prompt is chat messages) `prompts[i]` is those messages and
`completions[i]` is ``[{"role": "assistant", "content": text}]``; otherwise both are strings.
forge_nb passes the same, and also `targets`, `step`, `policy_version`, `sample_id`,
`prompt_id`, so a reward written for TRL runs unchanged and one written for forge_nb still does.

The prompt as the dataset gave it travels in a problem's extras under `PROMPT_AS_GIVEN` when it
differs from the text the model saw (chat messages, or a string given the chat template); it never
reaches a reward under that name.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

#: Key of `Problem.extras` holding the prompt as the dataset gave it (see the module docstring).
PROMPT_AS_GIVEN = "_forge_prompt_as_given"


@dataclass(frozen=True)
class TrainerState:
    """What a TRL reward may read of `transformers.TrainerState` (TRL passes ``trainer_state``):
    `global_step` is the training step the batch is scored at (forge_nb's `step`)."""

    global_step: int
    epoch: float | None = None
    max_steps: int = 0


def log_extra(column: str, values: list) -> None:
    """TRL's ``log_extra`` (a column for its completions table): accepted, not recorded."""


def log_metric(name: str, value: float) -> None:
    """TRL's ``log_metric`` (a scalar for its logs): accepted, not recorded."""


def is_messages(prompt: Any) -> bool:
    """Whether `prompt` is chat messages ([{"role": ..., "content": ...}, ...])."""
    return isinstance(prompt, list | tuple) and bool(prompt) and all(isinstance(m, dict) for m in prompt)


def completion_as_given(prompt: Any, completion: str) -> str | list[dict[str, str]]:
    """`completion` as TRL gives it for `prompt`: one assistant message after chat messages, else the text."""
    return [{"role": "assistant", "content": completion}] if is_messages(prompt) else completion


def batched_keywords(
    prompts: list,
    completions: list[str],
    completion_ids: list[list[int]],
    targets: list[str],
    contexts: list[dict],
    step: int,
) -> dict[str, Any]:
    """Every keyword of a batched reward, N samples each: `prompts` as given (messages or text),
    `completions` in the matching form, `completion_ids` (N lists of token ids), `targets`, one list
    of N per context column (dataset columns and forge_nb's step, policy_version, sample_id,
    prompt_id; None where a row lacks it), and TRL's `trainer_state`, `log_extra`, `log_metric`."""
    keys = dict.fromkeys(k for context in contexts for k in context if k != PROMPT_AS_GIVEN)
    return {
        **{key: [context.get(key) for context in contexts] for key in keys},
        "prompts": prompts,
        "completions": [completion_as_given(p, c) for p, c in zip(prompts, completions)],
        "completion_ids": completion_ids,
        "targets": targets,
        "trainer_state": TrainerState(global_step=step),
        "log_extra": log_extra,
        "log_metric": log_metric,
    }


def prompt_as_given(prompt_text: str, extras: dict) -> Any:
    """The prompt as the dataset gave it: `extras[PROMPT_AS_GIVEN]`, else the text the model saw."""
    return extras.get(PROMPT_AS_GIVEN, prompt_text)
