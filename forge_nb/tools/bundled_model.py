"""Recipe for the bundled model: a tiny Llama trained briefly on the bundled task.

The warm start is deliberately short: the model answers some held-out additions but not most, so
GRPO has signal from the first step. Everything is seeded; `build` reproduces the committed model.
Run ``python -m forge_nb.tools.bundled_model OUT_DIR`` to rebuild it.
"""

from __future__ import annotations

import argparse
import random
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge_nb.engines.base import SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.rl.batch import collate, token_logprobs
from forge_nb.tasks.arithmetic import ALPHABET, Addition
from forge_nb.tools.char_tokenizer import build_tokenizer


@dataclass(frozen=True)
class Recipe:
    """Architecture and warm-start schedule. Defaults build the committed bundled model."""

    hidden_size: int = 128
    intermediate_size: int = 384
    num_layers: int = 2
    num_heads: int = 4
    max_positions: int = 64
    max_digits: int = 2
    sft_steps: int = 1500
    batch_size: int = 64
    lr: float = 3e-3
    seed: int = 0


def build(out_dir: str | Path, recipe: Recipe = Recipe(), log_every: int = 100) -> float:
    """Build, warm-start and save the model to `out_dir` (HF format). Returns held-out greedy accuracy."""
    torch.manual_seed(recipe.seed)
    tokenizer = build_tokenizer(ALPHABET)
    model = LlamaForCausalLM(_config(recipe, tokenizer))
    task = Addition(max_digits=recipe.max_digits, seed=recipe.seed)
    _warm_start(model, tokenizer, task, recipe, log_every)
    accuracy = greedy_accuracy(TorchEngine(model, tokenizer), task)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return accuracy


def _config(recipe: Recipe, tokenizer) -> LlamaConfig:
    return LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_heads,
        max_position_embeddings=recipe.max_positions,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        tie_word_embeddings=False,
    )


def _warm_start(model, tokenizer, task: Addition, recipe: Recipe, log_every: int) -> None:
    """Supervised next-token loss on answer tokens only (prompt tokens are context)."""
    optimizer = torch.optim.AdamW(model.parameters(), lr=recipe.lr)
    model.train()
    for step in range(recipe.sft_steps):
        problems = task.sample(recipe.batch_size)
        prompts = [tokenizer(p.prompt)["input_ids"] for p in problems]
        answers = [
            tokenizer(p.target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id] for p in problems
        ]
        batch = collate(prompts, answers, tokenizer.pad_token_id)
        loss = -token_logprobs(model, batch).sum() / batch.completion_mask.sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        if log_every and step % log_every == 0:
            print(f"sft step {step:4d} loss {loss.item():.3f}")
    model.eval()


def greedy_accuracy(engine: TorchEngine, task: Addition, max_tokens: int = 8) -> float:
    """Fraction of held-out problems answered exactly under greedy decoding."""
    problems = task.eval_set()
    out = engine.generate([p.prompt for p in problems], SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens))
    return sum(task.verify(c[0].text, p.target) for c, p in zip(out, problems)) / len(problems)


def random_model(out_dir: str | Path, width: int, layers: int, vocab: int = 0, seed: int = 0) -> Path:
    """The bundled model's architecture scaled up, randomly initialised: `width` hidden (heads of 64),
    3 x `width` MLP, `layers` layers, a vocabulary of `vocab` (0: the bundled tokenizer's 16), the
    bundled tokenizer beside it -> the HF directory. For benchmarks and the GPU check, where a model of
    0.5B-1B parameters makes numbers mean something (1536 x 16 with vocab 32000: 0.59B parameters)."""
    from transformers import AutoTokenizer

    from forge_nb.models import BUNDLED_MODEL

    base = LlamaConfig.from_pretrained(str(BUNDLED_MODEL)).to_dict()
    heads = max(1, width // 64)
    config = LlamaConfig(
        **{
            **base,
            "hidden_size": width,
            "intermediate_size": 3 * width,
            "num_hidden_layers": layers,
            "num_attention_heads": heads,
            "num_key_value_heads": heads,
            "head_dim": width // heads,
            "vocab_size": vocab or base["vocab_size"],
            "max_position_embeddings": max(base["max_position_embeddings"], 2048),
        }
    )
    torch.manual_seed(seed)
    out = Path(out_dir)
    LlamaForCausalLM(config).save_pretrained(out)
    AutoTokenizer.from_pretrained(str(BUNDLED_MODEL)).save_pretrained(out)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out_dir")
    parser.add_argument("--sft-steps", type=int, default=Recipe.sft_steps)
    args = parser.parse_args()
    random.seed(0)
    accuracy = build(args.out_dir, Recipe(sft_steps=args.sft_steps))
    print(f"held-out greedy accuracy {accuracy:.3f}")


if __name__ == "__main__":
    main()
