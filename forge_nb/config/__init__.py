"""Configuration as data: dataclasses with defaults that run, filled from kwargs, dicts or YAML.

Every field can be given by its section (``algorithm={"lr": 1e-4}``), by a dotted name
(``{"algorithm.lr": 1e-4}``), when the name is unique, bare (``lr=1e-4``), or by its name in TRL's
GRPOConfig (``learning_rate=1e-4``; `config.trl_names`). Unknown names and
invalid values raise `ConfigError` naming the field.
"""

from __future__ import annotations

import dataclasses
import difflib
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from forge_nb.config.agent import AgentConfig
from forge_nb.config.lora import LoraConfig
from forge_nb.config.sections import (
    TASK_NAMES,
    AlgorithmConfig,
    CheckpointConfig,
    ConfigError,
    EngineConfig,
    EvalConfig,
    LiveConfig,
    LogConfig,
    MeshConfig,
    ModelConfig,
    SlurmConfig,
    TaskConfig,
    WeightsConfig,
)
from forge_nb.config.session import SessionConfig
from forge_nb.config.trainer import TrainerConfig, check_devices
from forge_nb.config.trl_names import TRLConfigWarning, from_trl

__all__ = [
    "TASK_NAMES",
    "AgentConfig",
    "AlgorithmConfig",
    "CheckpointConfig",
    "Config",
    "ConfigError",
    "EngineConfig",
    "EvalConfig",
    "LiveConfig",
    "LogConfig",
    "LoraConfig",
    "MeshConfig",
    "ModelConfig",
    "SessionConfig",
    "SlurmConfig",
    "TRLConfigWarning",
    "TaskConfig",
    "TrainerConfig",
    "WeightsConfig",
    "parse_overrides",
]


@dataclass
class Config:
    model: ModelConfig = field(default_factory=ModelConfig)
    task: TaskConfig = field(default_factory=TaskConfig)
    engine: EngineConfig = field(default_factory=EngineConfig)
    mesh: MeshConfig = field(default_factory=MeshConfig)
    algorithm: AlgorithmConfig = field(default_factory=AlgorithmConfig)
    live: LiveConfig = field(default_factory=LiveConfig)
    weights: WeightsConfig = field(default_factory=WeightsConfig)
    slurm: SlurmConfig = field(default_factory=SlurmConfig)
    eval: EvalConfig = field(default_factory=EvalConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    log: LogConfig = field(default_factory=LogConfig)
    agent: AgentConfig = field(default_factory=AgentConfig)
    lora: LoraConfig = field(default_factory=LoraConfig)
    trainer: TrainerConfig = field(default_factory=TrainerConfig)
    session: SessionConfig = field(default_factory=SessionConfig)
    seed: int = 0

    def validate(self) -> Config:
        for section in _SECTIONS:
            getattr(self, section).validate()
        if self.lora.enabled:  # needs the model: targets it lacks or layers peft cannot wrap fail here
            from forge_nb.lora.targets import check_targets

            check_targets(self.model.resolved_path(), self.lora)
        check_devices(self)
        return self

    def engine_name(self) -> str:
        """The engine that serves this config: engine.name, with "auto" resolved for this model and
        machine (`forge_nb.engines.resolve_engine_name`)."""
        from forge_nb.engines import resolve_engine_name

        return resolve_engine_name(self.engine.name, self.model.resolved_path())

    @property
    def serve_dtype(self) -> str:
        """The dtype generators serve in (weights are converted on publish)."""
        return self.model.dtype if self.weights.serve_dtype == "same" else self.weights.serve_dtype

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> Config:
        return cls().updated(values)

    @classmethod
    def from_yaml(cls, path: str | Path) -> Config:
        return cls.from_dict(yaml.safe_load(Path(path).read_text()) or {})

    def updated(self, values: dict[str, Any]) -> Config:
        """A copy with `values` applied (section dicts, dotted or unique bare names, TRL's GRPOConfig
        names: `config.trl_names`), validated."""
        new = dataclasses.replace(self, **{s: dataclasses.replace(getattr(self, s)) for s in _SECTIONS})
        names = []  # every field set, dotted
        for key, value in from_trl(_without_legacy_clip_high(values), _is_field).items():
            if key in _SECTIONS and isinstance(value, dict):
                pairs = [(f"{key}.{sub}", v) for sub, v in value.items()]
            elif key in _MAIN_FIELD and isinstance(value, str):
                pairs = [(f"{key}.{_MAIN_FIELD[key]}", value)]
            else:
                pairs = [(_qualify(key), value)]
            for name, v in pairs:
                _set(new, name, v)
                names.append(name)
        # Giving a lora field (lora={...}, lora.r=8) asks for LoRA, unless lora.enabled is given too.
        if any(n.startswith("lora.") for n in names) and "lora.enabled" not in names:
            new.lora.enabled = True
        return new.validate()


def _without_legacy_clip_high(values: dict[str, Any]) -> dict[str, Any]:
    """`values` less the ``algorithm: {clip_high: 0.28}`` of a whole config written before clip_high applied to
    every clipped loss (`to_dict` wrote that default; only dapo read it; such a dump has no ratio_level), so a
    checkpoint's or an export's config runs its grpo or dr_grpo as it ran then (clipped at 1 +/- clip_eps)."""
    algorithm = values.get("algorithm")
    if not (isinstance(algorithm, dict) and algorithm.get("clip_high") == 0.28 and "ratio_level" not in algorithm):
        return values
    if algorithm.get("loss", "grpo") == "dapo":
        return values
    warnings.warn(
        f"algorithm.clip_high=0.28 in a config written before clip_high applied to every clipped loss: left out, "
        f"so loss {algorithm.get('loss', 'grpo')!r} clips at 1 +/- clip_eps as it did then (write ratio_level into "
        "the algorithm section to have it read as the upper clip)",
        stacklevel=4,
    )
    return {**values, "algorithm": {k: v for k, v in algorithm.items() if k != "clip_high"}}


_SECTIONS = (
    "model",
    "task",
    "engine",
    "mesh",
    "algorithm",
    "live",
    "weights",
    "slurm",
    "eval",
    "checkpoint",
    "log",
    "agent",
    "lora",
    "trainer",
    "session",
)
# A section given as a plain string sets its main field: model="smollm2-135m-instruct", engine="vllm", task="addition".
_MAIN_FIELD = {"model": "path", "engine": "name", "task": "name"}


def _fields(section: str) -> dict[str, dataclasses.Field]:
    return {f.name: f for f in dataclasses.fields(Config.__dataclass_fields__[section].default_factory)}


def _is_field(key: str) -> bool:
    """Whether forge_nb takes `key` itself: a section, a dotted field or a bare field name."""
    bare = [f"{s}.{key}" for s in _SECTIONS]
    return key in _SECTIONS or key in _all_names() or any(name in _all_names() for name in bare)


def _all_names() -> list[str]:
    return ["seed"] + [f"{s}.{f}" for s in _SECTIONS for f in _fields(s)]


def _qualify(key: str) -> str:
    """Bare field name -> "section.field" when exactly one section has it."""
    if "." in key or key == "seed":
        return key
    owners = [s for s in _SECTIONS if key in _fields(s)]
    if len(owners) == 1:
        return f"{owners[0]}.{key}"
    if len(owners) > 1:
        raise ConfigError(f"{key!r} is ambiguous; say one of {[f'{s}.{key}' for s in owners]}")
    return key


def _set(config: Config, name: str, value: Any) -> None:
    if name not in _all_names():
        close = difflib.get_close_matches(name, _all_names(), n=3)
        hint = f"; did you mean {' or '.join(close)}?" if close else f"; known fields: {', '.join(_all_names())}"
        raise ConfigError(f"unknown config field {name!r}{hint}")
    if name == "seed":
        config.seed = _coerce(name, value, int)
        return
    section, sub = name.split(".")
    default = getattr(Config(), section).__getattribute__(sub)
    if default is None:  # an optional field ("float | None"): None, or a value of the annotated type
        annotation = next(f.type for f in dataclasses.fields(getattr(Config(), section)) if f.name == sub)
        kind = {"float": float, "int": int, "str": str, "bool": bool}[str(annotation).split("|")[0].strip()]
        setattr(getattr(config, section), sub, None if value is None else _coerce(name, value, kind))
        return
    setattr(getattr(config, section), sub, _coerce(name, value, type(default)))


def _coerce(name: str, value: Any, expected: type) -> Any:
    """Accept ints for floats (1 -> 1.0); reject everything else of the wrong type, bools included."""
    if expected is float and isinstance(value, int) and not isinstance(value, bool):
        return float(value)
    if isinstance(value, bool) and expected is not bool:
        raise ConfigError(f"{name} must be {expected.__name__}, got bool {value!r}")
    if not isinstance(value, expected):
        raise ConfigError(f"{name} must be {expected.__name__}, got {type(value).__name__} {value!r}")
    return value


def parse_overrides(pairs: list[str]) -> dict[str, Any]:
    """["lr=1e-4", "group_size=4"] -> {"lr": 0.0001, "group_size": 4}: values are YAML scalars."""
    out = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep:
            raise ConfigError(f"expected FIELD=VALUE, got {pair!r}")
        loaded = yaml.safe_load(value)
        # YAML 1.1 reads 01:00:00 as the sexagesimal int 3600; a time limit must stay a string.
        out[key] = value if isinstance(loaded, int) and ":" in value else _yaml_float(loaded)
    return out


def _yaml_float(value: Any) -> Any:
    """YAML 1.1 reads 1e-4 (no dot) as a string; a number is what anyone typing it means."""
    if isinstance(value, str):
        try:
            return float(value)
        except ValueError:
            pass
    return value
