"""The `lora` section: train a LoRA adapter (through peft) instead of every weight.

``forge_nb.up(lora={"r": 16, "alpha": 32, "target_modules": [...]})`` turns it on (a `lora` dict
sets ``lora.enabled``). The trainer then trains only the adapter, the reference model is the base with
the adapter off (no second copy of the weights), and a refresh ships only the adapter's tensors.
Whether peft can wrap the model with these targets is checked on an empty (meta-device) copy of the
model when the config is validated, so a bad target fails before any proc starts.
"""

from __future__ import annotations

import importlib.util
from dataclasses import dataclass, field

from forge_nb.config.sections import ConfigError

#: Llama-family attention and MLP projections (SmolLM2, the bundled model, Qwen, Mistral name them alike).
DEFAULT_TARGETS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoraConfig:
    """A rank-`r` adapter on every module named in `target_modules` (a module's last name, e.g. "q_proj",
    or its full dotted name), scaled by ``alpha / r``, with `dropout` on its input while training."""

    enabled: bool = False  # set by passing a `lora` dict to up(); the other fields apply only when on
    r: int = 16
    alpha: float = 32.0
    dropout: float = 0.0
    target_modules: list[str] = field(default_factory=lambda: list(DEFAULT_TARGETS))
    serve: str = "merged"  # torch engine: "merged" into the weights each refresh, or as peft "layer"s (vLLM: its own)

    @property
    def scale(self) -> float:
        """What the adapter's product ``B @ A`` is multiplied by: ``alpha / r``."""
        return self.alpha / self.r

    def validate(self) -> None:
        if not self.enabled:
            return
        if importlib.util.find_spec("peft") is None:
            raise ConfigError("lora is on, but peft is not installed: pip install 'forge_nb[lora]'")
        if isinstance(self.r, bool) or not isinstance(self.r, int) or self.r <= 0:
            raise ConfigError(f"lora.r must be an integer >= 1, got {self.r!r}")
        if not self.alpha > 0:
            raise ConfigError(f"lora.alpha must be > 0, got {self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout must be in [0, 1), got {self.dropout}")
        if self.serve not in ("merged", "layer"):
            raise ConfigError(f"lora.serve must be one of ['merged', 'layer'], got {self.serve!r}")
        targets = self.target_modules
        if not isinstance(targets, list) or not targets or not all(isinstance(t, str) and t for t in targets):
            raise ConfigError(f"lora.target_modules must be a non-empty list of module names, got {targets!r}")
