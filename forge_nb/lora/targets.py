"""Check a `lora` config against its model before anything starts: every target names a module the
model has, and peft can wrap them (an empty, meta-device copy of the model is wrapped; no weights read)."""

from __future__ import annotations

import functools
from pathlib import Path
from typing import TYPE_CHECKING

from forge_nb.config.sections import ConfigError

if TYPE_CHECKING:
    import peft

    from forge_nb.config.lora import LoraConfig


def peft_config(lora: LoraConfig) -> peft.LoraConfig:
    """Our `lora` section as peft's `LoraConfig` (a causal LM; B starts at 0, so version 0 is the base)."""
    import peft

    return peft.LoraConfig(
        r=lora.r,
        lora_alpha=lora.alpha,
        lora_dropout=lora.dropout,
        target_modules=list(lora.target_modules),
        task_type="CAUSAL_LM",
    )


def check_targets(model_dir: str | Path, lora: LoraConfig) -> None:
    """Raise `ConfigError` if a target is not a module of the model in `model_dir`, or peft cannot wrap
    the model with this config (e.g. a target that is a norm layer)."""
    _check(str(model_dir), lora.r, lora.alpha, lora.dropout, tuple(lora.target_modules))


@functools.lru_cache(maxsize=16)  # Config.updated validates often; the answer depends only on these
def _check(model_dir: str, r: int, alpha: float, dropout: float, targets: tuple[str, ...]) -> None:
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    from forge_nb.config.lora import LoraConfig

    try:
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(AutoConfig.from_pretrained(model_dir))
    except Exception as e:
        raise ConfigError(
            f"lora: cannot build the model in {model_dir} to check it ({type(e).__name__}: {e})"
        ) from None
    names = [n for n, _ in model.named_modules() if n]
    linear = sorted({n.rpartition(".")[2] for n, m in model.named_modules() if isinstance(m, torch.nn.Linear)})
    # peft matches a target by a module's full name or its last parts; it refuses only when *none* match,
    # so one misspelt name among good ones would silently train less than asked for.
    missing = [t for t in targets if not any(n == t or n.endswith("." + t) for n in names)]
    if missing:
        raise ConfigError(
            f"lora.target_modules: {missing} not found in {type(model).__name__}; its linear layers are {linear}"
        )
    import peft

    try:
        peft.get_peft_model(model, peft_config(LoraConfig(True, r, alpha, dropout, list(targets))))
    except (ValueError, TypeError, NotImplementedError) as e:
        raise ConfigError(f"lora: peft cannot wrap {type(model).__name__} with {list(targets)}: {e}") from None
