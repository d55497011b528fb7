import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from forge_nb.models import BUNDLED_MODEL


def test_bundled_model_loads_with_plain_from_pretrained():
    model = AutoModelForCausalLM.from_pretrained(str(BUNDLED_MODEL))
    tokenizer = AutoTokenizer.from_pretrained(str(BUNDLED_MODEL))
    ids = tokenizer("12+34=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id and len(ids) == 7
    assert tokenizer.decode(ids, skip_special_tokens=True) == "12+34="
    logits = model(input_ids=torch.tensor([ids])).logits
    assert logits.shape == (1, 7, len(tokenizer))
    assert sum(p.numel() for p in model.parameters()) < 2_000_000  # committed file stays small
