"""A causal language model as a judge: messages through its chat template, then a verdict per message.

Two ways to read a verdict (`verdicts.JudgeRequest.mode`):
- "choice": one forward pass; at the first answer token, the probability mass of each choice (its
  first token, with and without a leading space, capitalised or not), renormalised over the choices
  -> P(first choice) per message. No decoding, so it costs one prefill.
- "generate": greedy decoding of up to `max_tokens` (`model.generate`, KV cache) -> text per message.

Messages are sorted by length and run `batch_size` at a time (left-padded), so padding stays small.
This runs in the judge actor (`actors.judge`), never in the kernel.
"""

from __future__ import annotations

import time
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from forge_nb.padding import left_padded
from forge_nb.rewards.verdicts import JudgeAnswer, JudgeRequest


class JudgeModel:
    """Serves verdicts from `model` with `tokenizer` (loaded from an HF directory by `load`)."""

    def __init__(self, model: PreTrainedModel, tokenizer) -> None:
        self.model, self.tokenizer = model.eval(), tokenizer
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.device = next(self.model.parameters()).device

    @classmethod
    def load(cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> JudgeModel:
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(torch.device(device))
        model.requires_grad_(False)
        return cls(model, AutoTokenizer.from_pretrained(str(model_dir)))

    def encode(self, messages: list[str], system_prompt: str = "") -> list[list[int]]:
        """Token ids of each user message as the judge sees it: through its chat template (with the
        generation prompt) when it has one, else the raw text."""
        if not getattr(self.tokenizer, "chat_template", None):
            return [self.tokenizer(m)["input_ids"] for m in messages]
        system = [{"role": "system", "content": system_prompt}] if system_prompt else []
        render = self.tokenizer.apply_chat_template
        chats = [[*system, {"role": "user", "content": m}] for m in messages]
        return [list(render(chat, add_generation_prompt=True, tokenize=True, return_dict=False)) for chat in chats]

    def answer(self, request: JudgeRequest) -> JudgeAnswer:
        """The verdicts of `request` -> probabilities or texts, compute seconds, tokens run."""
        start = time.perf_counter()
        ids = self.encode(request.messages, request.system_prompt)
        tokens = sum(map(len, ids))
        if request.mode == "choice":
            probabilities = self.choice_probabilities(ids, request.choices, request.batch_size)
            return JudgeAnswer(probabilities, None, time.perf_counter() - start, tokens)
        if request.mode != "generate":
            raise ValueError(f"judge request mode must be 'choice' or 'generate', got {request.mode!r}")
        texts, generated = self.generate(ids, request.max_tokens, request.batch_size)
        return JudgeAnswer(None, texts, time.perf_counter() - start, tokens + generated)

    def choice_tokens(self, choices: tuple[str, ...]) -> list[list[int]]:
        """For each choice, the first tokens that start it (spelling variants), none shared with another choice."""
        found = []
        for choice in choices:
            variants = {choice, " " + choice, choice.lower(), " " + choice.lower(), choice.capitalize()}
            firsts = {ids[0] for v in variants if (ids := self.tokenizer.encode(v, add_special_tokens=False))}
            found.append(firsts)
        shared = {t for i, a in enumerate(found) for b in found[i + 1 :] for t in a & b}
        tokens = [sorted(f - shared) for f in found]
        empty = [c for c, t in zip(choices, tokens) if not t]
        if empty:
            raise ValueError(f"judge choices {empty} have no first token of their own in the judge's vocabulary")
        return tokens

    @torch.inference_mode()
    def choice_probabilities(self, ids: list[list[int]], choices: tuple[str, ...], batch_size: int) -> list[float]:
        """P(first choice) among `choices` at the next token after each prompt ([N] floats in [0, 1])."""
        tokens = self.choice_tokens(choices)
        out = [0.0] * len(ids)
        for rows in _batches(ids, batch_size):
            logits = self._last_logits([ids[i] for i in rows])  # [b, V]
            probs = torch.softmax(logits.float(), -1)
            mass = torch.stack([probs[:, t].sum(-1) for t in tokens], -1)  # [b, choices]
            first = (mass[:, 0] / mass.sum(-1).clamp_min(1e-30)).tolist()
            for i, p in zip(rows, first):
                out[i] = p
        return out

    @torch.inference_mode()
    def generate(self, ids: list[list[int]], max_tokens: int, batch_size: int) -> tuple[list[str], int]:
        """Greedy text of up to `max_tokens` after each prompt -> (texts, tokens generated)."""
        texts, generated = [""] * len(ids), 0
        for rows in _batches(ids, batch_size):
            input_ids, mask = self._left_padded([ids[i] for i in rows])
            out = self.model.generate(
                input_ids=input_ids,
                attention_mask=mask,
                max_new_tokens=max_tokens,
                do_sample=False,
                pad_token_id=self.pad_id,
            )[:, input_ids.shape[1] :]
            for i, new in zip(rows, out.tolist()):
                new = [t for t in new if t != self.pad_id]
                texts[i] = self.tokenizer.decode(new, skip_special_tokens=True)
                generated += len(new)
        return texts, generated

    def _last_logits(self, prompts: list[list[int]]) -> torch.Tensor:
        """Logits at the last position of each prompt, left-padded into one forward pass -> [b, V]."""
        input_ids, mask = self._left_padded(prompts)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        # logits_to_keep=1: the LM head (a fifth of SmolLM2-135M's weights) runs on the last position only
        out = self.model(input_ids=input_ids, attention_mask=mask, position_ids=positions, logits_to_keep=1)
        return out.logits[:, -1]

    def _left_padded(self, prompts: list[list[int]]) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask, [b, width] each, on the model's device."""
        input_ids, mask = left_padded(prompts, self.pad_id)
        return input_ids.to(self.device), mask.to(self.device)


def _batches(ids: list[list[int]], batch_size: int) -> list[list[int]]:
    """Row indices grouped `batch_size` at a time, by length (less padding per forward pass)."""
    order = sorted(range(len(ids)), key=lambda i: len(ids[i]))
    return [order[i : i + max(1, batch_size)] for i in range(0, len(order), max(1, batch_size))]
