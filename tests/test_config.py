from pathlib import Path

import pytest

from forge_nb.config import Config, ConfigError
from forge_nb.models import BUNDLED_MODEL


def test_defaults_validate_and_point_at_the_bundled_model():
    config = Config().validate()
    assert config.model.resolved_path() == BUNDLED_MODEL
    assert (BUNDLED_MODEL / "model.safetensors").is_file()
    assert (BUNDLED_MODEL / "tokenizer.json").is_file()


def test_fields_can_be_given_bare_dotted_or_by_section():
    config = Config().updated({"lr": 1e-4, "engine.max_tokens": 5, "task": {"max_digits": 3}, "seed": 7})
    assert config.algorithm.lr == 1e-4
    assert config.engine.max_tokens == 5
    assert config.task.max_digits == 3
    assert config.seed == 7


def test_updated_leaves_the_original_untouched():
    base = Config()
    base.updated({"group_size": 4})
    assert base.algorithm.group_size == 8


def test_unknown_field_names_it_and_suggests_the_closest():
    with pytest.raises(ConfigError, match=r"unknown config field 'grop_size'; did you mean algorithm.group_size"):
        Config().updated({"grop_size": 4})


def test_invalid_value_names_the_field():
    with pytest.raises(ConfigError, match=r"algorithm.group_size must be >= 2, got 1"):
        Config().updated({"group_size": 1})
    with pytest.raises(ConfigError, match=r"algorithm.lr must be float, got str"):
        Config().updated({"lr": "fast"})
    with pytest.raises(ConfigError, match=r"engine.top_p must be in \(0, 1\]"):
        Config().updated({"top_p": 0.0})
    with pytest.raises(ConfigError, match=r"algorithm.top_entropy_quantile is the share of tokens.*got 1.5"):
        Config().updated({"top_entropy_quantile": 1.5})


def test_missing_model_directory_names_the_path(tmp_path: Path):
    missing = tmp_path / "no-such-model"
    with pytest.raises(ConfigError, match=rf"model.path: directory '{missing}' does not exist"):
        Config().updated({"model.path": str(missing)})
    with pytest.raises(ConfigError, match="has no config.json"):
        Config().updated({"model.path": str(tmp_path)})


def test_yaml_round_trip(tmp_path: Path):
    path = tmp_path / "run.yaml"
    path.write_text("algorithm:\n  lr: 0.001\n  group_size: 4\nseed: 3\n")
    config = Config.from_yaml(path)
    assert (config.algorithm.lr, config.algorithm.group_size, config.seed) == (0.001, 4, 3)
    assert Config.from_dict(config.to_dict()) == config


def test_engine_shorthand_and_auto_resolution(monkeypatch, tmp_path):
    import torch

    import forge_nb.engines as engines

    assert Config().updated({"engine": "torch"}).engine.name == "torch"
    monkeypatch.setenv("FORGE_NB_ENGINE", "torch")
    assert Config().engine_name() == "torch"
    monkeypatch.delenv("FORGE_NB_ENGINE")
    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    assert Config().engine_name() == "torch"
    monkeypatch.setattr(engines, "vllm_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert Config().engine_name() == "torch"  # the bundled model is small: the torch engine is faster on a CPU
    big = tmp_path / "big"
    big.mkdir()
    (big / "config.json").write_text("{}")
    with open(big / "model.safetensors", "wb") as f:  # sparse: 300 MB of weights as far as sizes go
        f.truncate(300 << 20)
    assert Config().updated({"model.path": str(big)}).engine_name() == "vllm"
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert Config().engine_name() == "vllm"  # on a GPU, always vLLM


def test_vllm_asked_for_but_not_installed_says_how_to_install(monkeypatch):
    import forge_nb.engines as engines

    monkeypatch.setattr(engines, "vllm_available", lambda: False)
    with pytest.raises(ConfigError, match=r"engine.name='vllm' but vLLM is not installed: pip install"):
        Config().updated({"engine.name": "vllm"})


def test_an_optional_field_takes_none_or_its_type():
    assert Config.from_dict({"clip_high": 0.3}).algorithm.clip_high == 0.3
    assert Config.from_dict({"clip_high": 1}).algorithm.clip_high == 1.0
    assert Config.from_dict({"clip_high": None}).algorithm.clip_high is None
    with pytest.raises(ConfigError, match="algorithm.clip_high must be float, got str 'x'"):
        Config.from_dict({"clip_high": "x"})


def test_a_config_written_before_clip_high_applied_to_every_loss_runs_as_it_did(tmp_path: Path):
    """Such a dump (a checkpoint's, an export's) holds clip_high: 0.28, the old default only dapo read."""
    old = Config.from_dict({"loss": "grpo"}).to_dict()
    del old["algorithm"]["ratio_level"]
    old["algorithm"]["clip_high"] = 0.28
    with pytest.warns(UserWarning, match="clip_high=0.28 in a config written before"):
        assert Config.from_dict(old).algorithm.upper_clip == 0.2
    old["algorithm"]["loss"] = "dapo"
    assert Config.from_dict(old).algorithm.upper_clip == 0.28  # dapo read it then too
    new = Config.from_dict({"loss": "grpo", "clip_high": 0.28}).to_dict()  # written now: it has ratio_level
    assert Config.from_dict(new).algorithm.upper_clip == 0.28
