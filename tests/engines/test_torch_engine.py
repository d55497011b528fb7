import re

import pytest
import torch

from forge_nb.engines.base import SamplingParams, WeightsRefused
from forge_nb.engines.torch_engine import TorchEngine, _top_p_filter
from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl.batch import collate, token_logprobs


@pytest.fixture(scope="module")
def engine():
    return TorchEngine.load(BUNDLED_MODEL)


def test_generate_returns_n_samples_per_prompt_with_a_logprob_per_token(engine):
    out = engine.generate(["1+1=", "57+68="], SamplingParams(n=3, max_tokens=5, seed=0))
    assert [len(group) for group in out] == [3, 3]
    for group in out:
        for c in group:
            assert 1 <= len(c.token_ids) <= 5
            assert len(c.logprobs) == len(c.token_ids)
            assert all(lp <= 0 for lp in c.logprobs)
            assert (c.finish_reason == "stop") == (c.token_ids[-1] == engine.eos_id)


def test_sampling_is_reproducible_with_a_seed(engine):
    params = SamplingParams(n=4, max_tokens=5, seed=123)
    a = engine.generate(["12+9="], params)
    b = engine.generate(["12+9="], params)
    assert [c.token_ids for c in a[0]] == [c.token_ids for c in b[0]]


def test_samples_of_one_prompt_share_its_prefill_but_are_drawn_independently(engine):
    out = engine.generate(["47+38=", "12+34="], SamplingParams(n=16, max_tokens=6, seed=2))
    for group in out:
        assert len({tuple(c.token_ids) for c in group}) > 1
        assert len({tuple(c.prompt_ids) for c in group}) == 1
    single = engine.generate(["47+38="], SamplingParams(n=1, max_tokens=6, seed=2))
    assert len(single[0]) == 1


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_cached_decoding_logprobs_match_a_full_forward(engine, temperature):
    """KV-cached, left-padded decoding gives the same logprobs as one right-padded forward."""
    prompts = ["3+4=", "99+99=", "10+5="]
    out = engine.generate(prompts, SamplingParams(n=2, temperature=temperature, max_tokens=6, seed=1))
    flat = [c for group in out for c in group]
    batch = collate([c.prompt_ids for c in flat], [c.token_ids for c in flat], engine.pad_id)
    with torch.no_grad():
        full = token_logprobs(engine.model, batch, temperature)
    for i, c in enumerate(flat):
        start = len(c.prompt_ids) - 1
        recomputed = full[i, start : start + len(c.token_ids)]
        assert torch.allclose(recomputed, torch.tensor(c.logprobs), atol=1e-5)


def test_greedy_is_argmax(engine):
    a = engine.generate(["25+25="], SamplingParams(n=2, temperature=0.0, max_tokens=5))
    assert a[0][0].token_ids == a[0][1].token_ids


def test_top_p_keeps_the_smallest_head_of_the_distribution():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    assert torch.equal(_top_p_filter(probs, 0.6) > 0, torch.tensor([[True, True, False, False]]))
    assert torch.equal(_top_p_filter(probs, 0.1) > 0, torch.tensor([[True, False, False, False]]))


def test_load_weights_replaces_the_served_weights(engine):
    before = engine.generate(["5+5="], SamplingParams(temperature=0.0, max_tokens=4))[0][0]
    original = {n: t.clone() for n, t in engine.named_weights()}
    engine.load_weights((n, torch.zeros_like(t)) for n, t in original.items())
    assert all(t.abs().sum() == 0 for _, t in engine.named_weights())
    engine.load_weights(original.items())
    after = engine.generate(["5+5="], SamplingParams(temperature=0.0, max_tokens=4))[0][0]
    assert after.token_ids == before.token_ids


def test_tensors_that_do_not_fit_are_refused_before_a_load(engine):
    shapes = {n: tuple(t.shape) for n, t in engine.named_weights()}
    engine.check_weights(shapes)  # its own: fine
    name = next(iter(shapes))
    with pytest.raises(WeightsRefused, match=rf"{name} is \(1, 2\), the model's {re.escape(str(shapes[name]))}"):
        engine.check_weights({**shapes, name: (1, 2)})
    with pytest.raises(WeightsRefused, match=r"lora_A is not a parameter of it \(and 1 more\)"):
        engine.check_weights({"lora_A": (4, 4), "lora_B": (4, 4)})


def test_stop_string_ends_the_completion_after_the_token_that_completes_it(engine):
    (full,) = engine.generate(["11+11="], SamplingParams(n=1, temperature=0.0, max_tokens=6))
    text = full[0].text
    assert len(text) >= 2
    stop = text[1]
    (cut,) = engine.generate(["11+11="], SamplingParams(n=1, temperature=0.0, max_tokens=6, stop=(stop,)))
    end = text.index(stop)
    assert cut[0].finish_reason == "stop" and cut[0].text == text[:end]
    assert cut[0].token_ids == full[0].token_ids[: end + 1] and cut[0].logprobs == full[0].logprobs[: end + 1]


def test_score_is_the_teacher_forced_logprob_of_a_greedy_completion(engine):
    (out,) = engine.generate(["25+17="], SamplingParams(n=1, temperature=0.0, max_tokens=5))
    (scored,) = engine.logprobs([out[0].prompt_ids], [out[0].token_ids])
    assert torch.allclose(torch.tensor(scored), torch.tensor(out[0].logprobs), atol=1e-5)


def test_stop_token_ids_end_a_completion_and_stay_in_it(engine):
    free = engine.generate(["47+38="], SamplingParams(n=16, max_tokens=6, seed=3))[0]
    stopper = next(t for c in free for t in c.token_ids[:-1] if t != engine.eos_id)  # a token sampled mid-way
    out = engine.generate(["47+38="], SamplingParams(n=16, max_tokens=6, seed=3, stop_token_ids=(stopper,)))[0]
    for c in out:
        assert c.token_ids.count(stopper) <= 1 and (stopper not in c.token_ids or c.token_ids[-1] == stopper)
        assert (c.finish_reason == "stop") == (c.token_ids[-1] in (stopper, engine.eos_id))
    assert any(c.token_ids[-1] == stopper for c in out)


def test_ignore_eos_samples_to_max_tokens(engine):
    out = engine.generate(["1+1="], SamplingParams(n=8, max_tokens=6, seed=0, ignore_eos=True))[0]
    assert all(len(c.token_ids) == 6 and c.finish_reason == "length" for c in out)


def test_top_k_samples_only_among_the_k_likeliest(engine):
    greedy = engine.generate(["12+9="], SamplingParams(n=1, temperature=0.0, max_tokens=4))[0][0]
    top_one = engine.generate(["12+9="], SamplingParams(n=8, temperature=1.0, max_tokens=4, seed=5, top_k=1))[0]
    assert all(c.token_ids == greedy.token_ids for c in top_one)
