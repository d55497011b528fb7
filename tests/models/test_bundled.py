import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from forge_nb.config import BUNDLED_MODEL
from forge_nb.models.recipe import Recipe, build
from forge_nb.weights.manifest import checksum


def test_bundled_model_loads_with_plain_from_pretrained():
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL))
    ids = tokenizer("12+34=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+34="
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, 7, len(tokenizer))
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # committed file stays small


def test_recipe_is_reproducible(tmp_path):
    recipe = Recipe(sft_steps=3, batch_size=8)
    build(tmp_path / "a", recipe, log_every=0)
    build(tmp_path / "b", recipe, log_every=0)
    a = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
    b = AutoModelForCausalLM.from_pretrained(str(tmp_path / "b"))
    assert checksum(a.named_parameters()) == checksum(b.named_parameters())
    assert (tmp_path / "a" / "tokenizer.json").is_file()
