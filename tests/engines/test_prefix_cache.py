"""An agent's next turn reuses the keys and values of its previous turn: the same tokens and logprobs as a
full prefill, fewer tokens prefilled; a weight load forgets them."""

import pytest
import torch

from forge_nb.engines.base import SamplingParams
from forge_nb.engines.prefix_cache import PrefixCache
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.models import BUNDLED_MODEL

TURN = SamplingParams(n=1, temperature=0.0, max_tokens=5, keep_prefix=True)


@pytest.fixture(scope="module")
def engine():
    return TorchEngine.load(BUNDLED_MODEL)


def two_turns(engine, first: list[list[int]], sampling: SamplingParams):
    """First turn of each prompt, then each conversation extended by its reply and a new message -> the second
    turn's completions and its prompts."""
    replies = engine.generate(first, sampling)
    message = engine.tokenizer("2+2=", add_special_tokens=False)["input_ids"]
    second = [[*p, *group[0].token_ids, *message[: 1 + i]] for i, (p, group) in enumerate(zip(first, replies))]
    return engine.generate(second, sampling), second


def test_a_second_turn_prefills_only_its_new_tokens_and_generates_as_a_full_prefill(engine):
    first = [engine.tokenizer(p)["input_ids"] for p in ["3+4=", "99+99=", "10+5="]]
    engine.prefixes.clear()
    hits, saved = engine.prefixes.hits, engine.prefixes.tokens_saved
    cached, second = two_turns(engine, first, TURN)
    assert engine.prefixes.hits - hits == 3 and engine.prefixes.tokens_saved - saved > sum(map(len, first))
    full = TorchEngine.load(BUNDLED_MODEL).generate(second, SamplingParams(n=1, temperature=0.0, max_tokens=5))
    for a, b in zip(cached, full):
        assert a[0].token_ids == b[0].token_ids
        assert torch.allclose(torch.tensor(a[0].logprobs), torch.tensor(b[0].logprobs), atol=1e-4)


def test_sampled_groups_reuse_their_own_rows(engine):
    """n samples of one prompt each keep their own reply; the next turn of each extends its own."""
    engine.prefixes.clear()
    prompt = engine.tokenizer("47+38=")["input_ids"]
    replies = engine.generate([prompt], SamplingParams(n=4, max_tokens=4, seed=3, keep_prefix=True))[0]
    second = [[*prompt, *c.token_ids, 7] for c in replies]
    hits = engine.prefixes.hits
    cached = engine.generate(second, SamplingParams(n=1, max_tokens=4, seed=5, keep_prefix=True))
    assert engine.prefixes.hits - hits == 4
    fresh = TorchEngine.load(BUNDLED_MODEL)
    full = fresh.generate(second, SamplingParams(n=1, max_tokens=4, seed=5))
    assert [g[0].token_ids for g in cached] == [g[0].token_ids for g in full]


def test_without_the_hint_nothing_is_kept_and_a_weight_load_forgets(engine):
    engine.prefixes.clear()
    engine.generate(["1+1="], SamplingParams(n=2, max_tokens=3, seed=0))
    assert engine.prefixes.longest_prefix([*engine.tokenizer("1+1=")["input_ids"], 5, 6, 7, 8]) is None
    engine.generate(["1+1="], TURN)
    assert engine.prefixes._rows
    engine.load_weights(list(engine.named_weights())[:1])
    assert not engine.prefixes._rows


def test_the_cache_keeps_within_its_byte_budget_dropping_the_oldest():
    layer = [(torch.zeros(2, 4, 8), torch.zeros(2, 4, 8))]  # 2 x 256 bytes
    cache = PrefixCache(max_bytes=1100)
    cache.keep([1, 2, 3, 4], layer)
    cache.keep([5, 6, 7, 8], layer)
    cache.keep([9, 10, 11, 12], layer)
    assert cache.longest_prefix([1, 2, 3, 4, 0]) is None and cache.longest_prefix([9, 10, 11, 12, 0]) is not None
    assert cache.longest_prefix([9, 10, 11, 12]) is None  # a prompt needs at least one token of its own


def test_an_adapter_refresh_forgets_too():
    from types import SimpleNamespace

    from forge_nb.lora.serve import MergedAdapter

    engine = SimpleNamespace(prefixes=PrefixCache(), named_weights=lambda: iter(()))
    engine.prefixes.keep([1, 2], [(torch.zeros(1, 2, 1), torch.zeros(1, 2, 1))])
    MergedAdapter(engine, scale=2.0).load([], version=1)
    assert engine.prefixes.longest_prefix([1, 2, 3]) is None
