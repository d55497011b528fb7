"""engine_backend over the real torch engine serving the bundled model."""

import pytest

from forge_nb.agents.backend import engine_backend
from forge_nb.engines.base import SamplingParams
from forge_nb.engines.torch_engine import TorchEngine
from forge_nb.models import BUNDLED_MODEL


@pytest.fixture(scope="module")
def engine():
    return TorchEngine.load(BUNDLED_MODEL)


@pytest.fixture
def engine_calls(engine, monkeypatch):
    """The (number of prompts, n) of every engine.generate call."""
    calls, generate = [], engine.generate

    def spy(prompts, sampling):
        calls.append((len(prompts), sampling.n))
        return generate(prompts, sampling)

    monkeypatch.setattr(engine, "generate", spy)
    return calls


def test_one_completion_per_prompt_in_order(engine, engine_calls):
    prompts = [engine.tokenizer(p)["input_ids"] for p in ["1+1=", "22+33=", "4+5="]]
    out = engine_backend(engine)(prompts, SamplingParams(max_tokens=4, seed=0))
    assert [c.prompt_ids for c in out] == prompts and engine_calls == [(3, 1)]
    assert all(len(c.logprobs) == len(c.token_ids) >= 1 for c in out)


def test_g_copies_of_each_prompt_are_prefilled_once_as_n_samples(engine, engine_calls):
    a, b = (engine.tokenizer(p)["input_ids"] for p in ["12+34=", "5+6="])
    prompts = [a, a, a, b, b, b]
    out = engine_backend(engine)(prompts, SamplingParams(max_tokens=6, seed=1))
    assert engine_calls == [(2, 3)]
    assert [c.prompt_ids for c in out] == prompts
    assert len({tuple(c.token_ids) for c in out[:3]}) > 1  # three independent samples of the same prompt


def test_uneven_repeats_go_one_by_one(engine, engine_calls):
    a, b = (engine.tokenizer(p)["input_ids"] for p in ["12+34=", "5+6="])
    out = engine_backend(engine)([a, a, b], SamplingParams(max_tokens=3, seed=0))
    assert engine_calls == [(3, 1)] and [c.prompt_ids for c in out] == [a, a, b]
