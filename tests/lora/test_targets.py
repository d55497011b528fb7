"""A `lora` config is checked against its model when it is validated: nothing starts on a bad one."""

import pytest

from forge_nb.config import Config, ConfigError
from forge_nb.session import Session
from tests.conftest import child_processes, wait_no_children


def test_a_lora_dict_turns_lora_on_with_its_fields():
    c = Config().updated({"lora": {"r": 4, "alpha": 8, "target_modules": ["q_proj", "v_proj"]}})
    assert c.lora.enabled and (c.lora.r, c.lora.alpha, c.lora.scale) == (4, 8.0, 2.0)
    assert c.lora.target_modules == ["q_proj", "v_proj"]
    assert not Config().lora.enabled


@pytest.mark.parametrize("r", [0, -2])
def test_a_rank_below_one_is_refused(r):
    with pytest.raises(ConfigError, match=rf"lora.r must be an integer >= 1, got {r}"):
        Config().updated({"lora": {"r": r}})


def test_an_unknown_target_module_is_refused_naming_the_models_linear_layers():
    with pytest.raises(ConfigError, match=r"\['qproj'\] not found in LlamaForCausalLM; its linear layers are \["):
        Config().updated({"lora": {"target_modules": ["q_proj", "qproj"]}})


def test_a_target_peft_cannot_wrap_is_refused():
    with pytest.raises(ConfigError, match=r"peft cannot wrap LlamaForCausalLM with \['input_layernorm'\]"):
        Config().updated({"lora": {"target_modules": ["input_layernorm"]}})


def test_bad_lora_fields_are_refused():
    with pytest.raises(ConfigError, match="lora.dropout must be in"):
        Config().updated({"lora": {"dropout": 1.0}})
    with pytest.raises(ConfigError, match="lora.target_modules must be a non-empty list"):
        Config().updated({"lora": {"target_modules": []}})


def test_up_with_a_bad_target_starts_nothing():
    before = {p.pid for p in child_processes()}  # a straggler of an earlier test is not this one's
    with pytest.raises(ConfigError, match="not found"):
        Session.up(lora={"target_modules": ["nope"]})
    left = wait_no_children(exclude=frozenset(before))
    assert left == [], [(p.pid, " ".join(p.cmdline())[:200]) for p in left]


def test_a_dotted_lora_field_turns_lora_on_unless_enabled_is_given():
    assert Config().updated({"lora.r": 4}).lora.enabled
    assert not Config().updated({"lora.r": 4, "lora.enabled": False}).lora.enabled
    saved = Config().updated({"lora": {"r": 4}}).to_dict()
    assert Config.from_dict(saved).lora.r == 4 and not Config.from_dict(Config().to_dict()).lora.enabled
