"""A model made from its rows (in one process, without FSDP2: the same build a rank runs) holds what
`from_pretrained` gives, stored buffers included; a directory it cannot read as the model's own is
left to the whole load."""

from __future__ import annotations

import json

import pytest
import torch
import transformers
from safetensors.torch import load_file, save_file
from transformers import AutoModelForCausalLM, LlamaForCausalLM

from forge_nb.models import BUNDLED_MODEL
from forge_nb.parallel import sharded_load
from forge_nb.parallel.sharded_load import NotByRows

CPU = torch.device("cpu")
IDS = torch.tensor([[1, 5, 7, 3, 9, 4]])


def build(folder, dtype=torch.float32, prepare=lambda m: m):
    return sharded_load.build(str(folder), dtype, prepare, lambda m: m, CPU, CPU)


def test_stored_buffers_are_read_and_a_tied_head_stays_the_embedding(tmp_path):
    """Gemma 4 keeps a `layer_scalar` buffer in its files (persistent): the constructor's 1.0 is not the
    stored 0.5; its head is tied to the embedding."""
    config = transformers.Gemma4TextConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        head_dim=16,
        vocab_size_per_layer_input=64,
        hidden_size_per_layer_input=8,
        layer_types=["sliding_attention", "full_attention"],
    )
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(config)
    with torch.no_grad():
        for layer in model.model.layers:
            layer.layer_scalar.fill_(0.5)
    model.save_pretrained(tmp_path)
    made, expected = build(tmp_path), AutoModelForCausalLM.from_pretrained(tmp_path, dtype=torch.float32)
    assert made.lm_head.weight is made.model.embed_tokens.weight
    assert [float(layer.layer_scalar) for layer in made.model.layers] == [0.5, 0.5]
    ours, theirs = made.state_dict(), expected.state_dict()
    assert ours.keys() == theirs.keys() and all(torch.equal(ours[k], theirs[k]) for k in theirs)
    with torch.no_grad():
        assert torch.equal(made(IDS).logits, expected(IDS).logits)


def _copy_bundled(folder, config_change=None, extra=None):
    folder.mkdir()
    config = json.loads((BUNDLED_MODEL / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **(config_change or {})}))
    tensors = load_file(BUNDLED_MODEL / "model.safetensors")
    save_file({**tensors, **(extra or {})}, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_a_directory_it_cannot_read_as_the_model_own_is_left_to_the_whole_load_saying_why(tmp_path, monkeypatch):
    assert build(_copy_bundled(tmp_path / "plain")) is not None
    quantized = _copy_bundled(tmp_path / "quantized", {"quantization_config": {"quant_method": "fp8"}})
    with pytest.raises(NotByRows, match="a quantization config"):
        build(quantized)
    extra = _copy_bundled(tmp_path / "extra", extra={"model.layers.0.mlp.gate_proj.weight_scale": torch.ones(1)})
    with pytest.raises(NotByRows, match=r"hold model.layers.0.mlp.gate_proj.weight_scale \(and 0 more\)"):
        build(extra)
    with pytest.raises(
        NotByRows, match=r"model.layers.0.mlp.gate_proj.weight is \(384, 128\) in the files, \(256, 128\)"
    ):
        build(_copy_bundled(tmp_path / "shape", {"intermediate_size": 256}))
    with pytest.raises(NotByRows, match="no safetensors files"):
        build(tmp_path / "quantized" / "nothing-here")
    monkeypatch.setattr(LlamaForCausalLM, "_keep_in_fp32_modules", ["lm_head"])
    with pytest.raises(NotByRows, match=r"keeps \['lm_head'\] in float32"):
        build(tmp_path / "plain", torch.bfloat16)  # from_pretrained would keep the head in float32
    assert build(tmp_path / "plain", torch.float32) is not None


def test_a_parameter_the_preparation_leaves_empty_is_named():
    def add_empty(model):
        model.extra = torch.nn.Linear(2, 2, device="meta")
        return model

    with pytest.raises(ValueError, match=r"\['extra.weight', 'extra.bias'\] are on the meta device"):
        build(BUNDLED_MODEL, prepare=add_empty)
