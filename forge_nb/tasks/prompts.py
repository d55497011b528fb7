"""How a problem's prompt becomes the model's input.

Chat messages go through the tokenizer's chat template, with the generation prompt added (and
`system_prompt` first when the messages have no system message); a plain string stays as it is,
for base models (`style="chat"` wraps strings as one user message instead; `style="raw"` refuses
messages). The text is what the samples table and the reward show; the token ids are what the
generator gets: a template's special tokens are in its text, so nothing is added when it is
tokenized (as `apply_chat_template` does).
"""

from __future__ import annotations

from forge_nb.config import ConfigError
from forge_nb.tasks.base import Messages, Problem

CACHE_SIZE = 200_000  # rendered prompts kept (by prompt id); beyond that the cache starts afresh


class PromptError(ConfigError):
    """A prompt the model cannot take; the message names the problem and the fix."""


class PromptFormat:
    """Renders and tokenizes prompts for one tokenizer; remembers each problem's result by id."""

    def __init__(self, tokenizer, style: str = "auto", system_prompt: str = "") -> None:
        self.tokenizer, self.style, self.system_prompt = tokenizer, style, system_prompt
        self._cache: dict[str, tuple[str, list[int]]] = {}

    def render(self, problem: Problem) -> tuple[str, list[int]]:
        """(the text the model sees, its token ids)."""
        texts, ids = self.render_all([problem])
        return texts[0], ids[0]

    def render_all(self, problems: list[Problem]) -> tuple[list[str], list[list[int]]]:
        """Texts and token ids of `problems`, in order; those not seen before tokenized in one call."""
        if len(self._cache) >= CACHE_SIZE:
            self._cache.clear()
        missing = {p.prompt_id: p.prompt for p in problems if p.prompt_id not in self._cache}
        texts = {prompt_id: self._text(prompt, prompt_id) for prompt_id, prompt in missing.items()}
        for special in (True, False):  # a batch may mix plain strings (raw) and chat messages
            ids = [i for i, (_, s) in texts.items() if s == special]
            if ids:
                tokenized = self.tokenizer([texts[i][0] for i in ids], add_special_tokens=special)["input_ids"]
                self._cache.update({i: (texts[i][0], row) for i, row in zip(ids, tokenized)})
        rendered = [self._cache[p.prompt_id] for p in problems]
        return [text for text, _ in rendered], [ids for _, ids in rendered]

    def encode(self, prompt: str | Messages, prompt_id: str = "given") -> tuple[str, list[int]]:
        """(text, token ids) of one prompt, not remembered (`render` remembers a problem's by id)."""
        text, special = self._text(prompt, prompt_id)
        return text, self.tokenizer(text, add_special_tokens=special)["input_ids"]

    def _text(self, prompt: str | Messages, prompt_id: str) -> tuple[str, bool]:
        """(the text the model sees, whether tokenizing it adds the tokenizer's special tokens: only for
        a plain string; a chat template's are in its text)."""
        if isinstance(prompt, str) and self.style != "chat":
            return prompt, True
        if self.style == "raw":
            raise PromptError(f"prompt {prompt_id}: chat messages, but task.prompt_format='raw'; give strings")
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if self.system_prompt and messages[0]["role"] != "system":
            messages.insert(0, {"role": "system", "content": self.system_prompt})
        if not getattr(self.tokenizer, "chat_template", None):
            raise PromptError(
                f"prompt {prompt_id}: chat messages, but the model's tokenizer has no chat template; give the prompts "
                "as strings (they go to the model as they are), or use an instruct model"
            )
        return self.tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True), False


def check_lengths(problems: list[Problem], prompts: PromptFormat, context: int, max_tokens: int) -> None:
    """Raise `PromptError` naming the first prompt that, with `max_tokens` to generate, does not fit
    the model's `context` (tokens)."""
    for problem in problems:
        length = len(prompts.render(problem)[1])
        if length + max_tokens > context:
            raise PromptError(
                f"prompt {problem.prompt_id} is {length} tokens; with engine.max_tokens={max_tokens} that exceeds the "
                f"model's context of {context} tokens (shorten it, or lower engine.max_tokens)"
            )
