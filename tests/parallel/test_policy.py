"""A trainer gang computes the one-proc update: 2 ranks (FSDP2 on gloo, real processes) and 1 rank take
the same 3 AdamW steps, for every loss of the family, and the state saved at 2 ranks loads at 1 and 2."""

from __future__ import annotations

import functools

import pytest
import torch

from forge_nb.config import AlgorithmConfig, TrainerConfig
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function
from forge_nb.live.validate import check_loss_value
from forge_nb.models import BUNDLED_MODEL
from forge_nb.rl.batch import TrainBatch
from forge_nb.rl.split import Split, plan
from forge_nb.testing.gang import run_gang

STEPS = 3


def batches(steps: int = STEPS, prompts: int = 4, group: int = 4) -> list[TrainBatch]:
    """`steps` GRPO-shaped batches (group-centred advantages, one group all 0; completions of varied
    length; behaviour logprobs near the model's)."""
    gen = torch.Generator().manual_seed(7)
    out = []
    for _ in range(steps):
        p_ids, c_ids, lps, advs = [], [], [], []
        for g in range(prompts):
            prompt = [1] + torch.randint(3, 15, (3 + g % 3,), generator=gen).tolist()
            adv = torch.randn(group, generator=gen)
            adv = (adv - adv.mean()) * (g != 1)
            for i in range(group):
                completion = torch.randint(3, 15, (1 + (g + i) % 5,), generator=gen).tolist() + [2]
                p_ids.append(prompt)
                c_ids.append(completion)
                lps.append((-2.5 + 0.3 * torch.randn(len(completion), generator=gen)).tolist())
                advs.append(float(adv[i]))
        out.append(TrainBatch(p_ids, c_ids, lps, advs))
    return out


def train(
    rank: int,
    world: int,
    budget: int,
    loss: str,
    save_to: str = "",
    load_from: str = "",
    rounds: int = 1,
    fail_first: bool = False,
    model: str = BUNDLED_MODEL,
    top_entropy: float = 1.0,
) -> dict:
    """On each rank: the bundled policy, AdamW at 5e-4, `rounds` x `STEPS` updates (saving its state to
    `save_to` after the first round, starting from `load_from`; `fail_first`: first a live loss that
    raises after the forward) -> the metrics, each step's whole weights and the trainer's logprobs, as
    the rank sees them, and the sizes of what it holds. `model` other than the bundled one: the whole
    weights after the last step only (a real model's are large). `top_entropy`: the loss's
    top_entropy_quantile."""
    from forge_nb.parallel.gang import Gang
    from forge_nb.parallel.policy import Policy, PolicySpec

    sharded = world > 1
    gang = Gang.join(torch.device("cpu"), 60.0) if sharded else Gang()
    spec = PolicySpec(model, "float32", "cpu", 0, 1.0, TrainerConfig(micro_batch_tokens=budget), sharded, 5e-4)
    policy = Policy(spec, gang)
    if load_from:
        policy.load_state(load_from)
    code = builtin_loss(AlgorithmConfig(loss=loss, top_entropy_quantile=top_entropy), max_tokens=6)
    loss_fn = compile_function(code)
    if fail_first:  # nothing steps, and the gang (FSDP2's iteration state) runs on
        with pytest.raises(ValueError, match="a loss cell's bug"):
            policy.update(batches()[0], _raises, 1.0, check_loss_value, False)
    rows, weights, logprobs = [], [], []
    for round in range(rounds):
        for batch in batches():
            metrics, lps = policy.update(batch, loss_fn, 1.0, check_loss_value, code.zero_advantage_inert)
            rows.append(metrics)
            logprobs.append(lps)
            weights.append({n: t.clone() for n, t in policy.whole_published()} if model == BUNDLED_MODEL else {})
        if save_to and round == 0:
            policy.save_state(save_to)
    if model != BUNDLED_MODEL:
        weights[-1] = {n: t.clone() for n, t in policy.whole_published()}
    return {"metrics": rows, "weights": weights, "logprobs": logprobs, "sizes": policy.sizes()}


def _raises(logprobs, old_logprobs, advantages, mask):
    raise ValueError("a loss cell's bug")


@functools.cache
def trained(world: int, loss: str, fail_first: bool = False) -> tuple:
    """`train` at `world` ranks with the two-micro-batch budget (each distinct run once per module)."""
    return tuple(run_gang(world, train, two_micro_batch_budget(), loss, "", "", 1, fail_first))


def two_micro_batch_budget() -> int:
    """A token budget that packs every test batch into exactly 2 micro-batches: then 1 rank runs both
    and 2 ranks one each, over the same rows (the same rounding), summed in the same order."""
    from forge_nb.rl.prefix_batch import PrefixBatch

    for budget in range(8, 400):
        counts = []
        for b in batches():
            t: PrefixBatch = b.collate(0)
            counts.append(len(plan(t, t.advantages != 0, Split(micro_batch_tokens=budget)).micro_batches))
        if counts == [2] * STEPS:
            return budget
    raise AssertionError("no budget gives 2 micro-batches")


def _close(a: dict, b: dict, atol: float, b_from: int = 0) -> float:
    """Assert loss and grad norm of `a`'s steps equal `b`'s (from step `b_from` on) -> the largest
    difference of any weight after any step."""
    worst = 0.0
    for step in range(STEPS):
        ma, mb = a["metrics"][step], b["metrics"][b_from + step]
        assert ma["loss"] == pytest.approx(mb["loss"], rel=atol, abs=atol), step
        assert ma["grad_norm"] == pytest.approx(mb["grad_norm"], rel=atol), step  # norms of ~30: relative
        for name, w in a["weights"][step].items():
            worst = max(worst, (w - b["weights"][b_from + step][name]).abs().max().item())
    return worst


@pytest.mark.parametrize("loss", ["grpo", "dr_grpo", "dapo"])
def test_two_ranks_take_the_one_rank_steps(loss):
    """With grpo the 2 ranks first run a live loss that raises after the forward: nothing steps (the
    weights stay equal to the 1-rank run's) and the gang's next steps run."""
    (one,) = trained(1, loss)
    two = trained(2, loss, loss == "grpo")
    assert two[0]["metrics"][0]["micro_batches"] == 1 and one["metrics"][0]["micro_batches"] == 2
    worst = _close(two[0], one, atol=1e-5)
    print(f"{loss}: largest weight difference after {STEPS} steps {worst:.2e}")
    assert worst <= 1e-5  # every weight after each of the 3 steps
    assert two[0]["logprobs"][1] == one["logprobs"][1]


def test_the_top_entropy_share_is_taken_over_every_ranks_tokens():
    """top_entropy_quantile: each rank's entropies are summed into the whole batch's before the loss runs, so the
    quantile is over every rank's tokens: 2 ranks, a micro-batch each, take the 1-rank step (it fails without the
    sum), which is not plain dapo's (the mask takes tokens out). 1 rank runs every row in one forward and 2 ranks
    half each: the rounding differs in the last bits, and a token whose entropy is at the threshold can flip by a
    later step, so the first step is compared. (Two passes with the sum: tests/rl/test_update.py.)"""
    (one,) = run_gang(1, train, 0, "dapo", "", "", 1, False, BUNDLED_MODEL, 0.2)
    two = run_gang(2, train, 0, "dapo", "", "", 1, False, BUNDLED_MODEL, 0.2)
    assert (one["metrics"][0]["micro_batches"], two[0]["metrics"][0]["micro_batches"]) == (1, 1)
    first = two[0]["metrics"][0], one["metrics"][0]
    assert first[0]["loss"] == pytest.approx(first[1]["loss"], abs=1e-6)
    assert first[0]["grad_norm"] == pytest.approx(first[1]["grad_norm"], rel=1e-5)
    (plain,) = trained(1, "dapo")
    # The quantile needs every row's entropies: the all-zero group is not skipped, as it is under plain dapo.
    assert one["metrics"][0]["rows_skipped"] == 0 < plain["metrics"][0]["rows_skipped"]
    assert one["metrics"][0]["grad_norm"] != pytest.approx(plain["metrics"][0]["grad_norm"], rel=1e-3)


@pytest.mark.slow
def test_smollm2_at_two_ranks_takes_the_one_rank_steps():
    """The real SmolLM2-135M-Instruct (tied embeddings, vocabulary 49152): 3 grpo steps at 2 ranks equal
    1 rank's -- loss and grad norm of each step, every weight after the last."""
    from forge_nb.models.registry import resolve_model

    smol, budget = str(resolve_model("smollm2-135m-instruct")), two_micro_batch_budget()
    (one,) = run_gang(1, train, budget, "grpo", "", "", 1, False, smol)
    two = run_gang(2, train, budget, "grpo", "", "", 1, False, smol)[0]
    for a, b in zip(two["metrics"], one["metrics"]):
        assert a["loss"] == pytest.approx(b["loss"], rel=1e-5, abs=1e-5)
        assert a["grad_norm"] == pytest.approx(b["grad_norm"], rel=1e-5)
    worst = max((w - one["weights"][-1][n]).abs().max().item() for n, w in two["weights"][-1].items())
    print(f"SmolLM2: largest weight difference after {STEPS} steps {worst:.2e}")
    assert worst <= 1e-5 and len(two["weights"][-1]) == len(one["weights"][-1]) > 0


def test_each_rank_holds_about_half_the_state():
    (one,), two = trained(1, "grpo"), trained(2, "grpo", True)
    per_rank = [r["sizes"]["rank_state_bytes"] for r in two]
    assert max(per_rank) <= 0.55 * one["sizes"]["rank_state_bytes"]
    assert two[0]["sizes"]["total_params"] == one["sizes"]["total_params"]


def test_state_saved_at_two_ranks_resumes_at_two_and_one_exactly(tmp_path):
    """Saved after 3 steps at 2 ranks; loaded at 2 and at 1 rank, the next 3 steps are, bit for bit,
    those the 2 ranks took without stopping (same batches, same budget: the same arithmetic)."""
    budget = two_micro_batch_budget()
    (straight, _) = run_gang(2, train, budget, "grpo", str(tmp_path), "", 2)
    resumed_two = run_gang(2, train, budget, "grpo", "", str(tmp_path))
    (resumed_one,) = run_gang(1, train, budget, "grpo", "", str(tmp_path))
    assert _close(resumed_two[0], straight, atol=0.0, b_from=STEPS) == 0.0
    assert _close(resumed_one, straight, atol=0.0, b_from=STEPS) == 0.0


def test_state_saved_at_one_rank_resumes_at_two_exactly(tmp_path):
    budget = two_micro_batch_budget()
    (straight,) = run_gang(1, train, budget, "grpo", str(tmp_path), "", 2)
    resumed_two = run_gang(2, train, budget, "grpo", "", str(tmp_path))
    assert _close(resumed_two[0], straight, atol=0.0, b_from=STEPS) == 0.0
