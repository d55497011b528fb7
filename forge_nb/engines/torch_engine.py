"""Plain-PyTorch generation engine with a KV cache, over any HF causal LM directory.

Prompts are left-padded into one batch and prefilled once each (the n samples of a prompt share its
prefill: the key/value cache is repeated n times after it), then decoded token by token reusing the
cache. An agent's calls (`SamplingParams.keep_prefix`) keep each row's keys and values, so its next
turn prefills only the new messages (`engines.prefix_cache`; cleared at every weight load).
It serves the tests, the single-process baseline and machines where vLLM cannot start; on a
CPU it is also the faster engine for small models (`benchmarks/engines.py`).
"""

from __future__ import annotations

import inspect
from collections.abc import Iterable, Iterator, Mapping, Sequence
from pathlib import Path

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer, PreTrainedModel

from forge_nb.engines import prefix_cache
from forge_nb.engines.base import Prompt, SamplingParams, WeightsRefused, cut_at_stop, encode_prompts
from forge_nb.padding import left_padded
from forge_nb.parallel.device import resolve_device
from forge_nb.rl.completion import Completion
from forge_nb.rl.prefix_batch import completion_logprobs


class TorchEngine:
    """Serves `model` (an HF causal LM) with `tokenizer`; both loaded from `model_dir` by `load`."""

    def __init__(self, model: PreTrainedModel, tokenizer) -> None:
        """`model` on the device it runs on (its parameters'): prompts, masks and sampling go there too."""
        self.model = model.eval()
        self.device = next(model.parameters()).device
        self.tokenizer = tokenizer
        self.eos_id: int = tokenizer.eos_token_id
        self.pad_id: int = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else self.eos_id
        self._generator = torch.Generator(self.device)
        self.prefixes = prefix_cache.PrefixCache()
        # A prefill needs the logits of the last position only: the LM head (a fifth of SmolLM2-135M's weights,
        # [W, V] logits per prompt) on every prompt token cost more than the rest of a short prompt's forward.
        accepts = "logits_to_keep" in inspect.signature(model.forward).parameters
        self._last_logits = {"logits_to_keep": 1} if accepts else {}

    @classmethod
    def load(cls, model_dir: str | Path, dtype: torch.dtype = torch.float32, device: str = "cpu") -> TorchEngine:
        """`device`: "cpu", "cuda" or "auto" (`parallel.device.resolve_device`)."""
        model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=dtype).to(resolve_device(device))
        return cls(model, AutoTokenizer.from_pretrained(str(model_dir)))

    def generate(self, prompts: Sequence[Prompt], sampling: SamplingParams) -> list[list[Completion]]:
        if sampling.seed is not None:
            self._generator.manual_seed(sampling.seed)
        encoded = encode_prompts(self.tokenizer, prompts)
        repeated = [ids for ids in encoded for _ in range(sampling.n)]
        tokens, logprobs, finished = self._decode(encoded, sampling)
        flat = [
            self._completion(p, t, lp, f, sampling.stop) for p, t, lp, f in zip(repeated, tokens, logprobs, finished)
        ]
        return [flat[i * sampling.n : (i + 1) * sampling.n] for i in range(len(prompts))]

    def _completion(
        self, prompt_ids: list[int], ids: list[int], lps: list[float], stopped: bool, stop: tuple[str, ...]
    ) -> Completion:
        text = self._text(ids)
        if stop and cut_at_stop(text, stop)[1]:
            # Keep the tokens up to the one that completes the stop string (as vLLM does).
            end = next(k for k in range(1, len(ids) + 1) if cut_at_stop(self._text(ids[:k]), stop)[1])
            ids, lps, stopped = ids[:end], lps[:end], True
            text = cut_at_stop(self._text(ids), stop)[0]
        return Completion(prompt_ids, ids, lps, text, "stop" if stopped else "length")

    def _text(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=True)

    @torch.inference_mode()
    def _decode(
        self, prompts: list[list[int]], sampling: SamplingParams
    ) -> tuple[list[list[int]], list[list[float]], list[bool]]:
        """P prompts -> P x n rows (prompt-major) of sampled tokens, their logprobs, and whether each stopped."""
        hits = self.prefixes.take(prompts) if sampling.keep_prefix else [None] * len(prompts)
        if any(hits):
            out, mask, positions = self._prefill_suffixes(prompts, hits)
        else:
            out, mask, positions = self._prefill(prompts)
        # Prefill each prompt once, then give each of its n samples a copy of its cache: the prompt
        # tokens dominate the forward passes when completions are short.
        cache, logits = out.past_key_values, out.logits[:, -1].repeat_interleave(sampling.n, 0)
        batch = len(prompts) * sampling.n
        if sampling.n > 1:
            cache.batch_repeat_interleave(sampling.n)
            mask, positions = mask.repeat_interleave(sampling.n, 0), positions.repeat_interleave(sampling.n, 0)
        next_pos = positions[:, -1:] + 1
        stops = torch.tensor([*([] if sampling.ignore_eos else [self.eos_id]), *sampling.stop_token_ids])
        stops = stops.to(self.device, torch.long)
        done = torch.zeros(batch, dtype=torch.bool, device=self.device)
        tokens: list[torch.Tensor] = []
        logps: list[torch.Tensor] = []
        alive: list[torch.Tensor] = []
        for step in range(sampling.max_tokens):
            token, logp = self._sample(logits, sampling)
            token = torch.where(done, torch.full_like(token, self.pad_id), token)
            tokens.append(token)
            logps.append(logp)
            alive.append(~done)
            done = done | torch.isin(token, stops)
            if bool(done.all()) or step == sampling.max_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones((batch, 1))], dim=1)
            out = self.model(
                input_ids=token[:, None],
                attention_mask=mask,
                position_ids=next_pos,
                past_key_values=cache,
                use_cache=True,
            )
            cache, logits, next_pos = out.past_key_values, out.logits[:, -1], next_pos + 1
        ids, lps, stopped = _unpad(torch.stack(tokens, 1), torch.stack(logps, 1), torch.stack(alive, 1), done)
        if sampling.keep_prefix and prefix_cache.supported(cache):
            self._keep(prompts, sampling.n, ids, len(tokens) - 1, cache, mask)
        return ids, lps, stopped

    def _prefill(self, prompts: list[list[int]]):
        """Left-padded prompts [B, W] through the model -> (output with its cache, mask [B, W], positions [B, W])."""
        input_ids, mask = (t.to(self.device) for t in left_padded(prompts, self.pad_id))
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        out = self.model(
            input_ids=input_ids, attention_mask=mask, position_ids=positions, use_cache=True, **self._last_logits
        )
        return out, mask, positions

    def _prefill_suffixes(self, prompts: list[list[int]], hits: list):
        """Prompts extending kept rows: their kept keys/values [B, L] (left-padded), then only the rest of each
        prompt [B, S] -> (output with the whole cache, mask [B, L + S], positions of the new tokens [B, S])."""
        kept = [len(h[0]) if h else 0 for h in hits]
        rest = [p[n:] for p, n in zip(prompts, kept)]
        cache, kept_mask = prefix_cache.batched([h[1] if h else None for h in hits], max(kept))
        input_ids, mask = left_padded(rest, self.pad_id)
        width = input_ids.shape[1]
        positions = torch.zeros_like(input_ids)
        for i, (ids, n) in enumerate(zip(rest, kept)):
            positions[i, width - len(ids) :] = torch.arange(n, n + len(ids))
        input_ids, positions = input_ids.to(self.device), positions.to(self.device)
        mask = torch.cat([kept_mask, mask], dim=1).to(self.device)
        out = self.model(
            input_ids=input_ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            **self._last_logits,
        )
        return out, mask, positions

    def _keep(self, prompts: list[list[int]], n: int, ids: list[list[int]], fed: int, cache, mask) -> None:
        """Keep each row's keys/values: its prompt and the first `fed` tokens of its reply (the last sampled
        token was never run through the model)."""
        rows = [(prompts[r // n], reply[:fed]) for r, reply in enumerate(ids)]
        layers = prefix_cache.rows_of(cache, mask, [len(p) + len(reply) for p, reply in rows])
        for (prompt, reply), kept in zip(rows, layers):
            self.prefixes.keep([*prompt, *reply], kept)

    def _sample(self, logits: torch.Tensor, sampling: SamplingParams) -> tuple[torch.Tensor, torch.Tensor]:
        """logits [B, V] -> (token [B], logprob of token under logits / temperature [B])."""
        logits = logits.float()
        if sampling.temperature <= 0:
            token = logits.argmax(-1)
            return token, torch.log_softmax(logits, -1).gather(-1, token[:, None])[:, 0]
        logp = torch.log_softmax(logits / sampling.temperature, -1)
        probs = logp.exp()
        if 0 < sampling.top_k < probs.shape[-1]:
            kth = probs.topk(sampling.top_k, dim=-1).values[:, -1:]
            probs = probs.masked_fill(probs < kth, 0.0)
        if sampling.top_p < 1.0:
            probs = _top_p_filter(probs, sampling.top_p)
        token = torch.multinomial(probs, 1, generator=self._generator)[:, 0]
        return token, logp.gather(-1, token[:, None])[:, 0]

    def logprobs(self, prompt_ids: list[list[int]], completion_ids: list[list[int]]) -> list[list[float]]:
        """Teacher-forced logprobs (temperature 1) of each completion after its prompt."""
        return completion_logprobs(self.model, prompt_ids, completion_ids, self.pad_id, 1.0)

    def check_weights(self, shapes: Mapping[str, tuple[int, ...]]) -> None:
        """`WeightsRefused` unless every name of `shapes` is a parameter of this model of that shape: what a
        trainer publishes is checked once, when a generator attaches, not half way through a load."""
        params = dict(self.model.named_parameters())
        misfits = [m for name, shape in shapes.items() if (m := _misfit(name, shape, params.get(name)))]
        if misfits:
            more = f" (and {len(misfits) - 1} more)" if len(misfits) > 1 else ""
            raise WeightsRefused(f"the trainer's tensors do not fit the served model: {misfits[0]}{more}")

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        self.prefixes.clear()  # kept keys/values belong to the weights that made them
        params = dict(self.model.named_parameters())
        for name, tensor in named_tensors:
            params[name].copy_(tensor)

    def named_weights(self) -> Iterator[tuple[str, torch.Tensor]]:
        yield from ((n, p.detach()) for n, p in self.model.named_parameters())


def _misfit(name: str, shape: tuple[int, ...], param: torch.Tensor | None) -> str:
    """Why a tensor of `shape` cannot be loaded into `param` (named `name`), or "" when it can."""
    if param is None:
        return f"{name} is not a parameter of it"
    if tuple(param.shape) != tuple(shape):
        return f"{name} is {tuple(shape)}, the model's {tuple(param.shape)}"
    return ""


def _top_p_filter(probs: torch.Tensor, top_p: float) -> torch.Tensor:
    """Zero the tail of each row of probs [B, V] beyond cumulative mass `top_p` (the top token stays)."""
    sorted_p, order = probs.sort(-1, descending=True)
    drop = sorted_p.cumsum(-1) - sorted_p > top_p
    sorted_p = sorted_p.masked_fill(drop, 0.0)
    return torch.zeros_like(probs).scatter(-1, order, sorted_p)


def _unpad(
    tokens: torch.Tensor, logps: torch.Tensor, alive: torch.Tensor, done: torch.Tensor
) -> tuple[list[list[int]], list[list[float]], list[bool]]:
    """[B, T] tensors -> per-row lists holding only the tokens generated while the row was alive."""
    lengths = alive.sum(1).tolist()
    ids = [row[:n] for row, n in zip(tokens.tolist(), lengths)]
    lps = [row[:n] for row, n in zip(logps.tolist(), lengths)]
    return ids, lps, done.tolist()
