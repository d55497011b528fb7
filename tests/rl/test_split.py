"""Micro-batches: the step on 4 micro-batches is the step on the whole batch, for every loss of the family
(the loss always sees the whole batch's normaliser), and the split itself (ranks, budgets) is sound."""

import copy

import pytest
import torch
from transformers import AutoModelForCausalLM

from forge_nb.config import AlgorithmConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl.batch import collate
from forge_nb.rl.prefix_batch import collate_prefix
from forge_nb.rl.split import Split, completion_values, micro_batches, partition, plan
from forge_nb.rl.update import UpdateOptions, policy_update

LOSSES = [
    AlgorithmConfig(loss="grpo"),
    AlgorithmConfig(loss="grpo", token_level=True),
    AlgorithmConfig(loss="dr_grpo"),
    AlgorithmConfig(loss="dapo"),
    AlgorithmConfig(loss="grpo", ratio_level="sequence"),  # GSPO: one ratio per sequence, over micro-batches too
    AlgorithmConfig(loss="cispo", off_policy_mask=0.05),
    AlgorithmConfig(loss="sapo", ratio_level="sequence"),
]


@pytest.fixture(scope="module")
def model():
    """In float64: a forward over other rows rounds differently in float32 (GEMMs blocked by batch
    size: logprobs of up to -18 differ by ~1e-5, gradients by ~7e-7), which is not what is tested here.
    (HF's RMSNorm still computes in float32: what is left is ~1e-8.)"""
    return AutoModelForCausalLM.from_pretrained(BUNDLED_MODEL, dtype=torch.float64)


def _batch(model, groups: int = 4, size: int = 4, layout=collate_prefix, zero_groups=(1,)):
    """`groups` prompts x `size` completions of varied length, advantages of a group summing to 0 (the
    groups in `zero_groups` all 0), behaviour logprobs the model's perturbed."""
    gen = torch.Generator().manual_seed(1)
    prompts, completions, advantages = [], [], []
    for g in range(groups):
        prompt = [1] + torch.randint(3, 15, (2 + g % 3,), generator=gen).tolist()
        adv = torch.randn(size, generator=gen)
        adv = (adv - adv.mean()) * (0 if g in zero_groups else 1)
        for i in range(size):
            prompts.append(prompt)
            completions.append(torch.randint(3, 15, (1 + (g + i) % 5,), generator=gen).tolist() + [2])
            advantages.append(float(adv[i]))
    batch = layout(prompts, completions, 0, None, advantages)
    with torch.no_grad():
        noise = 0.3 * torch.randn(batch.old_logprobs.shape, generator=gen)
        batch.old_logprobs = (batch.logprobs(model) + noise) * batch.completion_mask
    return batch


def _update(model, batch, loss_fn, budget: int, skip: bool = True):
    """One SGD step (lr 0.1) on a copy -> (metrics, logprobs, gradients, new weights)."""
    trained = copy.deepcopy(model)
    optimizer = torch.optim.SGD(trained.parameters(), lr=0.1)
    grads = {}
    step = optimizer.step

    def keep_grads_then_step():
        grads.update({n: p.grad.clone() for n, p in trained.named_parameters() if p.grad is not None})
        step()

    optimizer.step = keep_grads_then_step
    options = UpdateOptions(split=Split(micro_batch_tokens=budget), skip_zero_advantage=skip)
    metrics, logprobs = policy_update(trained, optimizer, batch, loss_fn, options)
    return metrics, logprobs, grads, {n: p.detach().clone() for n, p in trained.named_parameters()}


@pytest.mark.parametrize("layout", [collate_prefix, collate], ids=["prefix", "full"])
@pytest.mark.parametrize(
    "algorithm", LOSSES, ids=lambda a: a.loss + ("_token" if a.token_level else "") + f"_{a.ratio_level}"
)
def test_four_micro_batches_take_the_whole_batch_step(model, algorithm, layout):
    loss_fn = compile_function(builtin_loss(algorithm, max_tokens=6))
    batch = _batch(model, layout=layout)
    whole = _update(model, batch, loss_fn, budget=0)
    costs = [batch.completion_ids.shape[1] if layout is collate_prefix else batch.input_ids.shape[1]] * 16
    budget = (sum(costs) + 4 * (batch.prompt_ids.shape[1] if layout is collate_prefix else 0)) // 4 + 1
    parts = _update(model, batch, loss_fn, budget=budget)
    assert whole[0]["micro_batches"] == 1 and parts[0]["micro_batches"] == 4 - 1  # the zero group is not run
    assert parts[0]["loss"] == pytest.approx(whole[0]["loss"], abs=1e-6)
    assert parts[0]["grad_norm"] == pytest.approx(whole[0]["grad_norm"], abs=1e-6)
    assert torch.allclose(parts[1], whole[1], atol=1e-6)  # the logprobs the rollout log keeps
    for name, grad in whole[2].items():
        assert torch.allclose(parts[2][name], grad, atol=1e-6), name
    for name, weight in whole[3].items():
        assert torch.allclose(parts[3][name], weight, atol=1e-6), name


def test_a_live_loss_that_normalises_by_the_batch_still_sees_the_whole_batch(model):
    """A loss that is not a sum over rows (it standardises the advantages over the batch) gets the same
    gradient in micro-batches: it runs once on every row's logprobs."""

    def loss(logprobs, old_logprobs, advantages, mask):
        adv = (advantages - advantages.mean()) / (advantages.std() + 1e-6)
        return -((logprobs * mask).sum(1) * adv).mean() / mask.sum()

    batch = _batch(model, zero_groups=())
    whole = _update(model, batch, loss, budget=0, skip=False)
    parts = _update(model, batch, loss, budget=40, skip=False)
    assert parts[0]["micro_batches"] > 2
    for name, grad in whole[2].items():
        assert torch.allclose(parts[2][name], grad, atol=1e-6), name


def test_rows_are_cut_into_runs_of_near_equal_cost():
    costs = [1, 1, 1, 1, 4, 4, 1, 1, 1, 1]
    runs = partition(list(range(10)), costs, 2)
    assert runs[0] + runs[1] == list(range(10))
    assert abs(sum(costs[r] for r in runs[0]) - sum(costs[r] for r in runs[1])) <= 4
    assert sum(map(len, partition([0, 1], [3, 3], 4))) == 2  # more ranks than rows: some run none


def test_micro_batches_stay_within_the_budget_and_pay_each_prompt_once():
    costs, prompts = [5] * 6, [0, 0, 0, 1, 1, 1]
    runs = micro_batches(list(range(6)), costs, prompts, prompt_cost=10, budget=25)
    assert runs == [[0, 1, 2], [3, 4, 5]]  # 10 + 3 x 5 = 25 each
    assert micro_batches([0, 1], [30, 30], [0, 1], 0, 25) == [[0], [1]]  # a row over the budget runs alone
    assert micro_batches([0, 1, 2], [1, 1, 1], [0, 1, 2], 1, 0) == [[0, 1, 2]]


def test_every_rank_runs_as_many_micro_batches_as_the_busiest(model):
    batch = _batch(model, zero_groups=(0, 1, 2))  # only the last group runs: 4 rows
    ran = batch.advantages != 0
    plans = [plan(batch, ran, Split(rank, 3, micro_batch_tokens=0)) for rank in range(3)]
    assert all(p.count == max(len(q.micro_batches) for q in plans) for p in plans)
    rows = sorted(r for p in plans for mb in p.micro_batches for r in mb.tolist())
    assert rows == ran.nonzero()[:, 0].tolist()


def test_completion_values_read_either_layout_back_per_completion():
    prompts, completions = [[1, 5], [1, 5, 6, 7]], [[3, 4, 2], [2]]
    for layout in (collate, collate_prefix):
        batch = layout(prompts, completions, 0, [[0.1, 0.2, 0.3], [0.4]], [1.0, -1.0])
        rows = completion_values(batch.old_logprobs, batch.completion_mask)
        assert [len(r) for r in rows] == [3, 1]
        assert rows[0] == pytest.approx([0.1, 0.2, 0.3]) and rows[1] == pytest.approx([0.4])
