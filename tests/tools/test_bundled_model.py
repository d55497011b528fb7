from transformers import AutoModelForCausalLM

from forge_nb.tools.bundled_model import Recipe, build
from forge_nb.weights.manifest import checksum


def test_recipe_is_reproducible(tmp_path):
    recipe = Recipe(sft_steps=3, batch_size=8)
    build(tmp_path / "a", recipe, log_every=0)
    build(tmp_path / "b", recipe, log_every=0)
    a = AutoModelForCausalLM.from_pretrained(str(tmp_path / "a"))
    b = AutoModelForCausalLM.from_pretrained(str(tmp_path / "b"))
    assert checksum(a.named_parameters()) == checksum(b.named_parameters())
    assert (tmp_path / "a" / "tokenizer.json").is_file()
