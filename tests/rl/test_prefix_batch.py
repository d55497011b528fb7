"""Each prompt once per group: the same logprobs, gradients and optimizer step as full sequences."""

import copy
import random

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from forge_nb.config import AlgorithmConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.rl.batch import collate, token_logprobs
from forge_nb.rl.prefix_batch import collate_prefix, completion_logprobs, prefix_logprobs
from forge_nb.rl.update import policy_update


@pytest.fixture(scope="module")
def model():
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
    )
    return LlamaForCausalLM(config).eval()


def _groups(seed: int = 0):
    """Prompts of 2-12 tokens, each continued by 1-5 completions of 1-9 tokens (groups of unequal size)."""
    r = random.Random(seed)
    prompts, completions = [], []
    for _ in range(5):
        prompt = [r.randint(3, 63) for _ in range(r.randint(2, 12))]
        for _ in range(r.randint(1, 5)):
            prompts.append(prompt)
            completions.append([r.randint(3, 63) for _ in range(r.randint(1, 9))])
    return prompts, completions


def _full(model, prompts, completions, **collated):
    """Completion-token logprobs of the full-sequence path, as [B, Lc] (the prefix layout)."""
    batch = collate(prompts, completions, 0, **collated)
    lp = token_logprobs(model, batch)
    width = max(len(c) for c in completions)
    rows = [
        torch.nn.functional.pad(lp[i, len(p) - 1 : len(p) - 1 + len(c)], (0, width - len(c)))
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]
    return torch.stack(rows)


def test_each_distinct_prompt_is_collated_once_left_padded():
    prompts, completions = _groups()
    batch = collate_prefix(prompts, completions, 0)
    distinct = list(dict.fromkeys(map(tuple, prompts)))
    assert batch.prompt_ids.shape == (len(distinct), max(map(len, distinct)))
    for i, p in enumerate(prompts):
        row = batch.prompt_ids[batch.prompt_of[i]][batch.prompt_mask[batch.prompt_of[i]].bool()]
        assert row.tolist() == p and batch.prompt_mask[batch.prompt_of[i], -1] == 1  # left padding
    assert batch.completion_mask.sum().item() == sum(map(len, completions))


def test_logprobs_equal_the_full_sequence_path(model):
    prompts, completions = _groups()
    with torch.no_grad():
        shared = prefix_logprobs(model, collate_prefix(prompts, completions, 0), temperature=0.7)
        batch = collate(prompts, completions, 0)
        lp = token_logprobs(model, batch, temperature=0.7)
    for i, (p, c) in enumerate(zip(prompts, completions)):
        assert torch.allclose(shared[i, : len(c)], lp[i, len(p) - 1 : len(p) - 1 + len(c)], atol=1e-5)
        assert (shared[i, len(c) :] == 0).all()
    listed = completion_logprobs(model, prompts, completions, 0, 1.0)
    assert [len(x) for x in listed] == [len(c) for c in completions]


def test_gradients_equal_the_full_sequence_path(model):
    prompts, completions = _groups(1)
    weights = torch.randn(len(prompts), max(map(len, completions)), generator=torch.Generator().manual_seed(1))
    grads = []
    for path in ("prefix", "full"):
        m = copy.deepcopy(model)
        lp = (
            prefix_logprobs(m, collate_prefix(prompts, completions, 0))
            if path == "prefix"
            else _full(m, prompts, completions)
        )
        (lp * weights).sum().backward()
        grads.append({n: p.grad.clone() for n, p in m.named_parameters()})
    for name, g in grads[0].items():
        assert torch.allclose(g, grads[1][name], rtol=1e-4, atol=1e-6), name


def test_select_keeps_the_rows_and_only_their_prompts(model):
    prompts, completions = _groups(2)
    batch = collate_prefix(prompts, completions, 0, advantages=[float(i) for i in range(len(prompts))])
    rows = torch.tensor([0, len(prompts) - 1])
    picked = batch.select(rows)
    assert picked.advantages.tolist() == [0.0, float(len(prompts) - 1)]
    assert picked.prompt_ids.shape[0] == len({tuple(prompts[0]), tuple(prompts[-1])})
    with torch.no_grad():
        assert torch.allclose(prefix_logprobs(model, picked), prefix_logprobs(model, batch)[rows], atol=1e-6)


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo"])
def test_an_optimizer_step_equals_the_full_sequence_step(model, loss):
    prompts, completions = _groups(3)
    gen = torch.Generator().manual_seed(3)
    advantages = torch.randn(len(prompts), generator=gen).tolist()
    behaviour = [(torch.randn(len(c), generator=gen) * 0.3 - 2).tolist() for c in completions]
    loss_fn = compile_function(builtin_loss(AlgorithmConfig(loss=loss), max_tokens=9))
    results = []
    for batch in (
        collate_prefix(prompts, completions, 0, behaviour, advantages),
        collate(prompts, completions, 0, behaviour, advantages),
    ):
        trained = copy.deepcopy(model)
        before = {n: p.detach().clone() for n, p in trained.named_parameters()}
        metrics, _ = policy_update(trained, torch.optim.SGD(trained.parameters(), lr=1.0), batch, loss_fn)
        results.append((metrics, {n: p.detach() - before[n] for n, p in trained.named_parameters()}))
    (prefix, prefix_delta), (full, full_delta) = results
    assert prefix["loss"] == pytest.approx(full["loss"], rel=1e-5)
    assert prefix["grad_norm"] == pytest.approx(full["grad_norm"], rel=1e-4)
    assert prefix["tokens"] == full["tokens"]
    for name, delta in prefix_delta.items():
        assert torch.allclose(delta, full_delta[name], rtol=1e-4, atol=1e-7), name
