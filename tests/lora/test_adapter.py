"""The trainer's adapter: only it trains, it is published under peft's saved names, and it is saved in
peft's format (loadable by `PeftModel.from_pretrained`) with the merged model beside it."""

import peft
import torch
from peft.utils import get_peft_model_state_dict
from transformers import AutoModelForCausalLM

from forge_nb.config import LoraConfig
from forge_nb.lora import adapter
from forge_nb.models import BUNDLED_MODEL

LORA = LoraConfig(enabled=True, r=4, alpha=8.0, target_modules=["q_proj", "v_proj", "down_proj"])
IDS = torch.tensor([[1, 5, 7, 3, 9, 4]])


def _trained() -> torch.nn.Module:
    """The bundled model with an adapter whose B is not 0 (as after training)."""
    model = adapter.wrap(AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL), LORA)
    torch.manual_seed(0)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.normal_(0, 0.1)
    return model.eval()


def test_only_the_adapter_trains_and_is_published_under_peft_saved_names():
    model = _trained()
    published = dict(adapter.adapter_tensors(model))
    assert published.keys() == get_peft_model_state_dict(model).keys()
    assert all(p.requires_grad == (".lora_" in n) for n, p in model.named_parameters())
    counts = adapter.parameter_counts(model)
    # 2 layers x (q, v: 4 x 128 + 128 x 4; down: 4 x 384 + 128 x 4) float32
    assert counts["trainable_params"] == 2 * (2 * 1024 + 2048) == sum(t.numel() for t in published.values())
    assert counts["adapter_bytes"] == 4 * counts["trainable_params"] < counts["total_params"]


def test_a_saved_adapter_loads_in_peft_and_the_merged_model_in_transformers(tmp_path):
    model = _trained()
    adapter.save(model, tmp_path / "a", merged=True)
    with torch.no_grad():
        expected = model(IDS).logits
        base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL)
        loaded = peft.PeftModel.from_pretrained(base, tmp_path / "a").eval()
        assert torch.equal(loaded(IDS).logits, expected)
        merged = AutoModelForCausalLM.from_pretrained(tmp_path / "a" / "merged").eval()
        assert torch.allclose(merged(IDS).logits, expected, atol=1e-5)


def test_the_adapter_off_is_the_base_model():
    model = _trained()
    base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL).eval()
    with torch.no_grad(), model.disable_adapter():  # the reference without a second copy of the weights
        assert torch.equal(model(IDS).logits, base(IDS).logits)
    with torch.no_grad():
        assert not torch.allclose(model(IDS).logits, base(IDS).logits)


def test_a_saved_adapter_wraps_a_16_bit_base_in_float32_exactly_as_saved(tmp_path):
    """Resuming (`adapter_dir`) gives the adapter the saved values, in float32 on a bfloat16 base as peft
    gives it, not rounded through the base's dtype; a fresh adapter is drawn the same whatever ran before."""
    model = _trained()
    adapter.save(model, tmp_path / "a")
    base = AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.bfloat16)
    resumed = adapter.wrap(base, LORA, str(tmp_path / "a"))
    saved = dict(adapter.adapter_tensors(model))
    for name, tensor in adapter.adapter_tensors(resumed):
        assert tensor.dtype == torch.float32 and tensor.requires_grad and torch.equal(tensor, saved[name]), name
    torch.manual_seed(123)  # the global seed plays no part
    fresh = dict(adapter.adapter_tensors(adapter.wrap(AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL), LORA)))
    first = dict(adapter.adapter_tensors(adapter.wrap(AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL), LORA)))
    assert all(torch.equal(fresh[n], first[n]) for n in fresh)
    assert all(bool((t == 0).all()) == (".lora_B." in n) for n, t in fresh.items())
