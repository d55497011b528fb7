"""A generator's torch engine serves each adapter version merged from an unmerged copy of the base."""

import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import LoraConfig
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.lora import adapter
from forge_nb.lora.serve import LayerAdapter, MergedAdapter, base_weight_name
from forge_nb.models import BUNDLED_MODEL

LORA = LoraConfig(enabled=True, r=4, alpha=8.0, target_modules=["q_proj", "o_proj", "up_proj"])
IDS = torch.tensor([[1, 5, 7, 3, 9, 4]])


def _adapter_version(model: torch.nn.Module, seed: int) -> list[tuple[str, torch.Tensor]]:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_" in name:
                p.normal_(0, 0.1)
    return [(n, t.detach().clone()) for n, t in adapter.adapter_tensors(model)]


def test_base_weight_name_maps_peft_names_to_the_hf_weight():
    name = "base_model.model.model.layers.1.self_attn.q_proj.lora_B.weight"
    assert base_weight_name(name) == "model.layers.1.self_attn.q_proj.weight"


def test_each_version_is_merged_from_the_base_not_on_top_of_the_last():
    policy = adapter.wrap(AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL), LORA).eval()
    engine, fresh = TorchEngine.load(BUNDLED_MODEL), TorchEngine.load(BUNDLED_MODEL)
    served, once = MergedAdapter(engine, LORA.scale), MergedAdapter(fresh, LORA.scale)
    served.load(_adapter_version(policy, 1), 1)
    v2 = _adapter_version(policy, 2)
    served.load(v2, 2)
    once.load(v2, 2)
    assert served.version == 2
    for (name, a), (_, b) in zip(engine.named_weights(), fresh.named_weights()):
        assert torch.equal(a, b), name  # v1 then v2 == v2 straight from the base, bit for bit
    with torch.no_grad():
        assert torch.allclose(engine.model(IDS).logits, policy(IDS).logits, atol=1e-5)


def test_as_peft_layers_the_served_model_equals_the_merged_one():
    policy = adapter.wrap(AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL), LORA).eval()
    layered, merged = TorchEngine.load(BUNDLED_MODEL), TorchEngine.load(BUNDLED_MODEL)
    as_layers, as_merge = LayerAdapter(layered, LORA), MergedAdapter(merged, LORA.scale)
    for version in (1, 2):
        tensors = _adapter_version(policy, version)
        as_layers.load(tensors, version)
        as_merge.load(tensors, version)
        with torch.no_grad():
            expected = policy(IDS).logits
            assert torch.allclose(layered.model(IDS).logits, expected, atol=1e-5)
            assert torch.allclose(merged.model(IDS).logits, expected, atol=1e-5)
