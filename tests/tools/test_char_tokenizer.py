from forge_nb.tools.char_tokenizer import build_tokenizer


def test_char_level_round_trip_with_bos_and_eos():
    tok = build_tokenizer("0123456789+=")
    ids = tok("907+15=")["input_ids"]
    assert ids[0] == tok.bos_token_id
    assert len(ids) == 1 + len("907+15=")
    assert tok.decode(ids + [tok.eos_token_id], skip_special_tokens=True) == "907+15="
