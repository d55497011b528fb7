"""TRL's GRPOConfig names as forge_nb config: aliases, and what a whole ``GRPOConfig.to_dict()`` becomes.

`from_trl(values)` rewrites TRL's names among `values` into forge_nb's dotted fields (a value in TRL's
terms, e.g. ``loss_type="bnpo"``, becomes the forge_nb fields that compute the same thing). A TRL name
and a forge_nb name for one field that disagree (``learning_rate=1e-5, lr=1e-4``) are a `ConfigError`.
Names that are in TRL's GRPOConfig (installed) but that forge_nb does not map are dropped: the ones
whose value differs from TRL's default are named in one `TRLConfigWarning`, the rest (TRL's defaults,
and its device and output settings) silently, so ``forge_nb.up(**GRPOConfig(...).to_dict())`` runs.
`temperature`, `top_p`, `max_grad_norm`, `seed` and `top_entropy_quantile` have the same name and meaning in both.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any

from forge_nb.config.sections import ConfigError

#: TRL's GRPOConfig name -> the forge_nb field it sets.
ALIASES = {
    "num_generations": "algorithm.group_size",
    "max_completion_length": "engine.max_tokens",
    "learning_rate": "algorithm.lr",
    "beta": "algorithm.kl_coef",
    "epsilon": "algorithm.clip_eps",
    "epsilon_high": "algorithm.clip_high",
    "loss_type": "algorithm.loss",
    "scale_rewards": "algorithm.normalize_std",
    "reward_weights": "algorithm.reward_weights",
    "multi_objective_aggregation": "algorithm.reward_aggregation",
    "generation_batch_size": "algorithm.prompts_per_step",
    "importance_sampling_level": "algorithm.ratio_level",
    "delta": "algorithm.clip_delta",
    "off_policy_mask_threshold": "algorithm.off_policy_mask",
    "sapo_temperature_pos": "algorithm.sapo_tau_pos",
    "sapo_temperature_neg": "algorithm.sapo_tau_neg",
    "mask_truncated_completions": "algorithm.mask_truncated",
    "use_bias_correction_kl": "algorithm.kl_unbiased",
    "num_iterations": "algorithm.epochs",
    "steps_per_generation": "algorithm.mini_batches",
}
#: TRL's loss_type -> forge_nb fields with the same per-token normalisation (one process, no accumulation).
LOSS_TYPES = {
    "grpo": {"algorithm.loss": "grpo", "algorithm.token_level": False},  # mean per sequence, then over sequences
    "bnpo": {"algorithm.loss": "grpo", "algorithm.token_level": True},  # mean over the batch's tokens
    "dr_grpo": {"algorithm.loss": "dr_grpo"},  # sum / (B x max_completion_length)
    "dapo": {"algorithm.loss": "dapo"},  # mean over the batch's tokens, clip-higher
    "cispo": {"algorithm.loss": "cispo"},  # clipped (detached) weights x A x logprobs, mean over the batch's tokens
    "sapo": {"algorithm.loss": "sapo"},  # soft gate, mean per sequence, then over sequences
    "luspo": {"algorithm.loss": "luspo"},  # clipped, summed per sequence, then the mean over sequences
    "vespo": {"algorithm.loss": "vespo"},  # a Gamma weight of each sequence's ratio x A x logprobs, token mean
}
TRL_EPSILON = 0.2  # GRPOConfig's default epsilon
#: TRL's scale_rewards -> (algorithm.normalize_std, algorithm.std_over).
SCALE_REWARDS = {True: (True, "group"), "group": (True, "group"), "batch": (True, "batch"), False: (False, "group"),
                 "none": (False, "group")}  # fmt: skip
#: GRPOConfig fields about where and how TRL runs (devices, files, hubs): never reported as ignored.
QUIET = frozenset(
    {"use_cpu", "bf16", "fp16", "tf32", "output_dir", "logging_dir", "report_to", "hub_token", "push_to_hub",
     "dataloader_pin_memory", "accelerator_config", "per_device_train_batch_size", "gradient_accumulation_steps"}
)  # fmt: skip


class TRLConfigWarning(UserWarning):
    """GRPOConfig fields forge_nb does not use, given with values other than TRL's defaults."""


def from_trl(values: dict[str, Any], known: Callable[[str], bool]) -> dict[str, Any]:
    """`values` with TRL's names rewritten as forge_nb's (dotted) and GRPOConfig fields forge_nb does
    not use dropped (warned about when they differ from TRL's defaults). `known(key)`: whether forge_nb
    itself takes `key` (those are left alone)."""
    original, values = values, dict(values)
    translated: dict[str, tuple[str, Any]] = {}  # forge_nb field -> (TRL name, value)
    for alias in [k for k in values if k in ALIASES]:
        given = values.pop(alias)
        for field, value in _convert(alias, given, original).items():
            _check_agrees(alias, given, field, value, values, translated)
            translated[field] = (alias, value)
    unknown = [k for k in values if not known(k)]
    ignored = _unmapped_trl_fields(unknown, values)
    for key in ignored:
        values.pop(key)
    differing = {k: v for k, v in ignored.items() if k not in QUIET and v is not _DEFAULT}
    if differing:
        named = ", ".join(f"{k}={v!r}" for k, v in differing.items())
        warnings.warn(
            TRLConfigWarning(
                f"GRPOConfig fields forge_nb does not use, set away from TRL's defaults: {named}. "
                "They are ignored; the fields forge_nb maps are used (README, 'Coming from TRL')."
            ),
            stacklevel=4,
        )
    return {**values, **{field: value for field, (_, value) in translated.items()}}


def _convert(alias: str, value: Any, values: dict[str, Any]) -> dict[str, Any]:
    """One TRL setting -> the forge_nb fields and values it means (empty: nothing to set)."""
    if alias == "loss_type":
        if value not in LOSS_TYPES:
            raise ConfigError(
                f"loss_type={value!r} is not in forge_nb; it has 'grpo', 'bnpo' (grpo with token_level=True), "
                "'dr_grpo', 'dapo', 'cispo', 'sapo', 'luspo' and 'vespo'; or write the loss in a cell (s.set_loss)"
            )
        if value == "cispo" and "epsilon_high" not in values:  # TRL caps CISPO's weights at epsilon_high or epsilon
            return {**LOSS_TYPES[value], "algorithm.rho_max": values.get("epsilon", TRL_EPSILON)}
        return LOSS_TYPES[value]
    if alias == "scale_rewards":
        if value not in SCALE_REWARDS:
            raise ConfigError(
                f"scale_rewards={value!r}: forge_nb divides advantages by their group's std ('group', True), by the "
                "batch's ('batch'), or not at all ('none', False)"
            )
        normalize, over = SCALE_REWARDS[value]
        return {ALIASES[alias]: normalize, "algorithm.std_over": over}
    if alias == "epsilon_high":
        value = values.get("epsilon", TRL_EPSILON) if value is None else value  # TRL: None is epsilon
        return {"algorithm.rho_max" if _loss(values) == "cispo" else ALIASES[alias]: value}
    if alias == "steps_per_generation" and value is not None:
        accumulation = values.get("gradient_accumulation_steps") or 1
        if value % accumulation:
            raise ConfigError(
                f"steps_per_generation={value} is not a multiple of gradient_accumulation_steps={accumulation}: "
                "forge_nb's algorithm.mini_batches (optimizer steps per pass over a batch) is their ratio"
            )
        return {ALIASES[alias]: value // accumulation}
    if alias == "reward_weights":
        return {} if value is None else {ALIASES[alias]: [float(w) for w in value]}
    if alias == "generation_batch_size":
        if value is None:
            return {}
        group = values.get("num_generations")
        if not isinstance(group, int) or value % group:
            raise ConfigError(
                f"generation_batch_size={value} needs num_generations (a divisor of it) beside it: forge_nb's "
                f"prompts_per_step is generation_batch_size / num_generations (got num_generations={group!r})"
            )
        return {ALIASES[alias]: value // group}
    return {} if value is None else {ALIASES[alias]: value}


def _loss(values: dict[str, Any]) -> Any:
    """The loss `values` ask for, by any of its names (None: not given)."""
    section = values.get("algorithm")
    nested = section.get("loss") if isinstance(section, dict) else None
    return values.get("loss_type", values.get("loss", values.get("algorithm.loss", nested)))


def _check_agrees(
    alias: str, given: Any, field: str, value: Any, values: dict[str, Any], translated: dict[str, tuple[str, Any]]
) -> None:
    section, name = field.split(".")
    for key, other in ((field, values.get(field)), (name, values.get(name)), (section, values.get(section))):
        if key == section:
            other = other.get(name) if isinstance(other, dict) else None
            key = f"{section}[{name!r}]"
        if other is not None and other != value:
            raise ConfigError(f"{alias}={given!r} (TRL's name for {field}: {value!r}) disagrees with {key}={other!r}")
    if field in translated and translated[field][1] != value:
        earlier, earlier_value = translated[field]
        raise ConfigError(f"{alias}={given!r} and {earlier} disagree on {field} ({value!r} vs {earlier_value!r})")


_DEFAULT = object()


def _unmapped_trl_fields(keys: list[str], values: dict[str, Any]) -> dict[str, Any]:
    """Those of `keys` that are GRPOConfig fields -> their value, or `_DEFAULT` where it is TRL's default."""
    defaults = _trl_defaults() if keys else {}
    return {k: _DEFAULT if _same(values[k], defaults[k]) else values[k] for k in keys if k in defaults}


def _same(value: Any, default: Any) -> bool:
    return value == default or (value in (None, [], {}, "") and default in (None, [], {}, ""))


@lru_cache(maxsize=1)
def _trl_defaults() -> dict[str, Any]:
    """``GRPOConfig(use_cpu=True).to_dict()`` of the installed TRL (derived fields included); {} without TRL."""
    try:
        from trl import GRPOConfig
    except ImportError:
        return {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return GRPOConfig(use_cpu=True).to_dict()
