"""An LLM judge as a reward: a real model reads each sample through a prompt template and gives a
verdict, which a parser turns into a score in [0, 1].

    from forge_nb.rewards import judge

    s.set_reward(judge(), name="judge", weight=0.5)      # SmolLM2-135M-Instruct: P("Yes")
    s.set_reward(judge(model="/models/my-judge", template=MY_TEMPLATE, parser="score"), name="judge")

The model runs in a judge actor of its own (started by the session the first time a reward that
asks it is set, never in the kernel); reward procs send it the whole batch's messages in one request
and it scores them in batches of `batch_size`. A `Judge` is a batched reward (`rewards.forms`): use
it as it is, call it from your own reward, or put it in an `Ensemble` as one weak verifier.

Template fields: ``{question}`` (the last user message of the prompt, `prompt_text.question_of`),
``{prompt}`` (the whole prompt as the policy saw it), ``{completion}``, ``{target}`` (the label:
leave it out to judge without labels) and any column of your data by name.

Parsers: ``"yes_no"`` (default) reads no text: one forward pass gives the probability of the first
of `choices` against the others at the first answer token -- cheap and graded. ``"score"`` generates
up to `max_tokens` and reads the first number as a score out of 10; ``"yes_no_text"`` generates and
reads yes (1) or no (0); or pass your own ``parse(text) -> float | None``. A verdict that does not
parse scores `unparsed`.
"""

from __future__ import annotations

import math
import re
import string
from collections.abc import Callable
from dataclasses import dataclass

import forge_nb.rewards.judge_client as judge_client
from forge_nb.rewards.prompt_text import as_text, question_of
from forge_nb.rewards.verdicts import JudgeRequest

DEFAULT_MODEL = "smollm2-135m-instruct"
DEFAULT_TEMPLATE = (
    "Question: {question}\nProposed answer: {completion}\nIs the proposed answer correct? Answer Yes or No."
)
_SINGULAR = {"prompts": "prompt", "completions": "completion", "targets": "target"}
_FIRST_NUMBER = re.compile(r"-?\d+(?:\.\d+)?")


def parse_score(text: str) -> float | None:
    """The first number in `text` as a score out of 10 ("8/10" -> 0.8), clipped to [0, 1]; None if none."""
    found = _FIRST_NUMBER.search(text)
    return None if found is None else min(1.0, max(0.0, float(found.group()) / 10.0))


def parse_yes_no(text: str) -> float | None:
    """1.0 for a verdict that says yes first, 0.0 for no, None for neither."""
    words = re.findall(r"[a-z]+", text.lower())
    for word in words:
        if word in ("yes", "correct", "true"):
            return 1.0
        if word in ("no", "not", "incorrect", "wrong", "false"):
            return 0.0
    return None


PARSERS: dict[str, Callable[[str], float | None] | None] = {
    "yes_no": None,  # no text: the probability of the first choice
    "score": parse_score,
    "yes_no_text": parse_yes_no,
}


@dataclass(frozen=True)
class Judge:
    """A model judge reward (build it with `judge`). Called with a batch's columns -> one score per sample."""

    model: str = DEFAULT_MODEL
    template: str = DEFAULT_TEMPLATE
    parser: str | Callable[[str], float | None] = "yes_no"
    choices: tuple[str, ...] = ("Yes", "No")
    system_prompt: str = ""
    max_tokens: int = 8
    batch_size: int = 16
    timeout_s: float = 300.0
    unparsed: float = 0.0

    def __call__(self, prompts: list[str], completions: list[str], **columns: list) -> list[float]:
        messages = render(self.template, {"prompts": prompts, "completions": completions, **columns})
        if self.parser == "yes_no":
            request = JudgeRequest(messages, "choice", self.choices, self.system_prompt, 1, self.batch_size)
            return judge_client.ask(self.model, request, self.timeout_s).probabilities
        request = JudgeRequest(messages, "generate", self.choices, self.system_prompt, self.max_tokens, self.batch_size)
        texts = judge_client.ask(self.model, request, self.timeout_s).texts
        parse = self.parser if callable(self.parser) else PARSERS[self.parser]
        return [_finite(parse(text), self.unparsed) for text in texts]


def template_fields(template: str) -> list[str]:
    """The field names a template reads, in order (``{question}`` -> "question")."""
    try:
        return [name for _, name, _, _ in string.Formatter().parse(template) if name]
    except ValueError as e:
        raise ValueError(f"judge template: {e} (write a literal brace as {{{{ or }}}})") from None


def render(template: str, columns: dict[str, list]) -> list[str]:
    """The judge's user message for every sample: `template` filled from the batch's `columns`."""
    named = {_SINGULAR.get(k, k): v for k, v in columns.items()}
    for key in ("prompt", "completion"):  # chat messages (TRL's conversational form) -> their text
        named[key] = [as_text(x) for x in named.get(key, [])]
    fields = template_fields(template)
    size = len(named["completion"])
    values: dict[str, list] = {}
    for name in dict.fromkeys(fields):
        if name == "question":
            values[name] = [question_of(p) for p in named["prompt"]]
        elif name in named:
            values[name] = named[name]
        else:
            hidden = " (an Ensemble hides the targets: its verifiers judge without labels)" if name == "target" else ""
            raise KeyError(f"judge template reads {{{name}}}, which is not a column{hidden}; columns: {sorted(named)}")
    return [template.format(**{name: values[name][i] for name in values}) for i in range(size)]


def judge(
    model: str = DEFAULT_MODEL,
    template: str = DEFAULT_TEMPLATE,
    parser: str | Callable[[str], float | None] = "yes_no",
    **options,
) -> Judge:
    """A `Judge` reward, checked here (the model name or directory, the template, the parser) so a
    mistake shows in the cell that wrote it. `options`: choices, system_prompt, max_tokens,
    batch_size, timeout_s, unparsed (see `Judge`)."""
    from forge_nb.models.registry import check_model

    check_model(model)
    template_fields(template)
    if not callable(parser) and parser not in PARSERS:
        raise ValueError(f"judge parser must be one of {sorted(PARSERS)} or a function(text) -> float; got {parser!r}")
    unknown = set(options) - set(Judge.__dataclass_fields__)
    if unknown:
        raise TypeError(f"judge() got unknown options {sorted(unknown)}; known: {sorted(Judge.__dataclass_fields__)}")
    if "choices" in options:
        options["choices"] = tuple(options["choices"])
        if len(options["choices"]) < 2:
            raise ValueError("judge choices: give at least two, the favourable one first, e.g. ('Yes', 'No')")
    return Judge(model, template, parser, **options)


def _finite(value: float | None, default: float) -> float:
    return float(value) if value is not None and math.isfinite(value) else default
