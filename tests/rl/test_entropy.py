"""The metrics a researcher reads every step, from the update's own forward: the policy's entropy on its tokens
(equal to a direct computation, and the same whether the batch runs whole or in micro-batches), the clip
fraction against the algorithm's range, and the response lengths."""

import copy
import math

import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import AlgorithmConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl import entropy
from forge_nb.rl.batch import collate
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.split import Split
from forge_nb.rl.update import UpdateOptions, policy_update


@pytest.fixture(scope="module")
def model():
    return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float64)


def _rows():
    """4 prompts x 4 completions of 2-6 tokens, advantages centred per group."""
    gen = torch.Generator().manual_seed(3)
    prompts, completions, advantages = [], [], []
    for g in range(4):
        prompt = [1] + torch.randint(3, 15, (2 + g % 3,), generator=gen).tolist()
        adv = torch.randn(4, generator=gen)
        for i, a in enumerate((adv - adv.mean()).tolist()):
            prompts.append(prompt)
            completions.append(torch.randint(3, 15, (1 + (g + i) % 5,), generator=gen).tolist() + [2])
            advantages.append(a)
    return prompts, completions, advantages


def _batch(model, layout=collate_prefix, shift: float = 0.0):
    """The rows in `layout`; behaviour logprobs the model's own, plus `shift`."""
    batch = layout(*_rows()[:2], 0, None, _rows()[2])
    with torch.no_grad():
        batch.old_logprobs = (batch.logprobs(model) + shift) * batch.completion_mask
    return batch


def _metrics(model, batch, budget: int = 0, loss: str = "grpo") -> dict:
    trained = copy.deepcopy(model)
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss=loss), max_tokens=6))
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    return policy_update(trained, optimizer, batch, loss_fn, UpdateOptions(split=Split(micro_batch_tokens=budget)))[0]


@torch.no_grad()
def _direct_entropy(model) -> float:
    """Mean over every completion token of -sum p log p, each sequence run alone, whole."""
    total, count = 0.0, 0
    for prompt, completion in zip(*_rows()[:2]):
        logp = torch.log_softmax(model(input_ids=torch.tensor([prompt + completion])).logits[0], -1)
        at = logp[len(prompt) - 1 : len(prompt) + len(completion) - 1]  # the positions predicting the completion
        total += -(at.exp() * at).sum().item()
        count += len(completion)
    return total / count


@pytest.mark.parametrize("layout", [collate_prefix, collate], ids=["prefix", "full"])
def test_entropy_is_the_policys_on_its_tokens_whole_or_in_micro_batches(model, layout):
    batch = _batch(model, layout)
    whole, parts = _metrics(model, batch), _metrics(model, batch, budget=20)
    assert parts["micro_batches"] > 1
    assert whole["entropy"] == pytest.approx(_direct_entropy(model), rel=1e-6)
    assert parts["entropy"] == pytest.approx(whole["entropy"], rel=1e-9)
    vocab = model.config.vocab_size
    assert 0 < whole["entropy"] < math.log(vocab)


def test_clip_fraction_counts_tokens_outside_the_algorithms_range(model):
    assert _metrics(model, _batch(model))["clip_fraction"] == 0.0  # on-policy: every ratio is 1
    # Behaviour logprobs 0.25 above the policy's: every ratio is e^-0.25 = 0.78, below GRPO's 0.8, which clips
    # the tokens of the sequences with a negative advantage ...
    batch = _batch(model, shift=0.25)
    tokens = batch.loss_mask.sum(1)
    negative = tokens[batch.advantages < 0].sum() / tokens.sum()
    assert 0 < negative < 1 and _metrics(model, batch)["clip_fraction"] == pytest.approx(negative.item())
    # ... inside [0.7, 1.28] for clip 0.3 (the policy_update default is GRPO's 0.2).
    trained = copy.deepcopy(model)
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=6))
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    metrics = policy_update(trained, optimizer, _batch(model, shift=0.25), loss_fn, UpdateOptions(clip=(0.3, 0.28)))[0]
    assert metrics["clip_fraction"] == 0.0


def test_response_lengths_are_the_policy_tokens_per_sequence(model):
    lengths = [len(c) for c in _rows()[1]]
    metrics = _metrics(model, _batch(model))
    assert metrics["response_length"] == pytest.approx(sum(lengths) / len(lengths))
    assert metrics["response_length_max"] == max(lengths)


def test_nothing_is_kept_when_nobody_asks():
    entropy.note(torch.zeros(1, 2, 3), torch.ones(1, 2))  # no `taking` block: a no-op
    with entropy.taking() as taken:
        entropy.note(torch.log_softmax(torch.zeros(1, 2, 4), -1), torch.tensor([[1.0, 0.0]]))
    assert torch.allclose(taken[0], torch.tensor([[math.log(4), 0.0]]))


def test_without_the_entropy_metric_the_step_is_the_same_and_entropy_is_nan(model):
    batch = _batch(model)
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss="grpo"), max_tokens=6))
    steps = []
    for with_entropy in (True, False):
        trained = copy.deepcopy(model)
        optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
        metrics = policy_update(trained, optimizer, batch, loss_fn, UpdateOptions(with_entropy=with_entropy))[0]
        steps.append((metrics, [p.detach().clone() for p in trained.parameters()]))
    (on, weights_on), (off, weights_off) = steps
    assert math.isnan(off["entropy"]) and on["entropy"] > 0 and on["loss"] == off["loss"]
    assert all(torch.equal(a, b) for a, b in zip(weights_on, weights_off))
