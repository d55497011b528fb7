import math

import pytest
import torch

from forge_nb.rl.losses import Modifiers, dr_grpo_loss, grpo_loss, masked_mean


def test_on_policy_loss_is_minus_mean_advantage_and_gradient_is_advantage():
    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    loss = grpo_loss(logprobs, logprobs.detach(), adv, mask)
    # ratio 1 everywhere: per-sequence means are -1 and +2 -> mean 0.5
    assert math.isclose(loss.item(), 0.5)
    loss.backward()
    # d/dlogp of -ratio*A averaged: seq 0 has 2 tokens (1/2 each), seq 1 one token; / 2 sequences
    expected = torch.tensor([[-0.25, -0.25], [1.0, 0.0]])
    assert torch.allclose(logprobs.grad, expected)


def test_ratio_is_clipped_for_positive_advantage():
    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(2.0))  # ratio 2
    loss = grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), clip_eps=0.2)
    assert math.isclose(loss.item(), -1.2, rel_tol=1e-6)


def test_ratio_is_not_clipped_when_it_makes_things_worse():
    # negative advantage with ratio 2: min(2 * -1, 1.2 * -1) = -2 -> loss 2
    loss = grpo_loss(torch.full((1, 1), math.log(2.0)), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1))
    assert math.isclose(loss.item(), 2.0, rel_tol=1e-6)


def test_token_level_weights_every_token_equally():
    logprobs = torch.zeros(2, 3)
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, -1.0])
    # token-level: (-1 -1 -1 +1) / 4 = -0.5; sequence-level: (-1 + 1) / 2 = 0
    assert math.isclose(grpo_loss(logprobs, logprobs, adv, mask, token_level=True).item(), -0.5)
    assert math.isclose(grpo_loss(logprobs, logprobs, adv, mask).item(), 0.0)


def test_empty_mask_gives_zero_not_nan():
    logprobs = torch.zeros(2, 3, requires_grad=True)
    loss = grpo_loss(logprobs, logprobs.detach(), torch.ones(2), torch.zeros(2, 3))
    assert loss.item() == 0.0
    loss.backward()
    assert torch.isfinite(logprobs.grad).all()
    assert masked_mean(torch.ones(3), torch.zeros(3)).item() == 0.0


def test_dr_grpo_divides_by_a_constant_not_by_each_length():
    from forge_nb.rl.losses import dr_grpo_loss

    logprobs = torch.zeros(2, 4)
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0], [1.0, 0.0, 0.0, 0.0]])
    adv = torch.tensor([1.0, 1.0])
    # on-policy: per token -A; sum = -5 over B x T = 8 tokens
    assert math.isclose(dr_grpo_loss(logprobs, logprobs, adv, mask).item(), -5 / 8)
    assert math.isclose(dr_grpo_loss(logprobs, logprobs, adv, mask, max_tokens=10).item(), -5 / 20)


def test_dapo_clips_higher_above_than_below():
    from forge_nb.rl.losses import dapo_loss

    old = torch.zeros(1, 1)
    up = torch.full((1, 1), math.log(2.0))  # ratio 2, positive advantage: clipped at 1 + 0.28
    assert math.isclose(dapo_loss(up, old, torch.tensor([1.0]), torch.ones(1, 1)).item(), -1.28, rel_tol=1e-6)
    down = torch.full((1, 1), math.log(0.5))  # ratio 0.5, negative advantage: clipped at 1 - 0.2
    assert math.isclose(dapo_loss(down, old, torch.tensor([-1.0]), torch.ones(1, 1)).item(), 0.8, rel_tol=1e-6)


def test_k3_is_zero_at_the_reference_and_matches_the_formula():
    from forge_nb.rl.losses import kl_k3

    lp = torch.tensor([[-1.0, -2.0]])
    assert torch.equal(kl_k3(lp, lp), torch.zeros(1, 2))
    r = 0.5
    assert math.isclose(kl_k3(torch.tensor([[-1.0]]), torch.tensor([[-0.5]])).item(), math.exp(r) - r - 1, rel_tol=1e-6)


def test_the_builtin_loss_with_kl_coef_adds_beta_times_the_sequence_mean_kl():
    from forge_nb.config import AlgorithmConfig
    from forge_nb.live.builtin import builtin_loss
    from forge_nb.live.capture import compile_function
    from forge_nb.rl.losses import kl_k3

    loss_fn = compile_function(builtin_loss(AlgorithmConfig(kl_coef=0.1), max_tokens=2))
    lp = torch.tensor([[-1.0, -1.0]])
    ref = torch.tensor([[-0.5, -1.0]])
    mask = torch.ones(1, 2)
    kl = kl_k3(lp, ref).mean().item()
    loss = loss_fn(lp, lp, torch.tensor([1.0]), mask, ref)
    assert math.isclose(loss.item(), -1.0 + 0.1 * kl, rel_tol=1e-6)


def test_aipo_truncates_the_importance_weight_and_detaches_it():
    from forge_nb.rl.losses import aipo_loss

    old = torch.zeros(1, 2)
    lp = torch.tensor([[math.log(3.0), math.log(0.5)]], requires_grad=True)  # ratios 3 (-> 2) and 0.5
    loss = aipo_loss(lp, old, torch.tensor([1.0]), torch.ones(1, 2), rho_max=2.0)
    expected = -(2.0 * math.log(3.0) + 0.5 * math.log(0.5)) / 2
    assert math.isclose(loss.item(), expected, rel_tol=1e-6)
    loss.backward()
    assert torch.allclose(lp.grad, torch.tensor([[-1.0, -0.25]]))  # -w * A / N, w not differentiated


def test_kl_penalty_is_beta_times_the_per_sequence_mean_k3_and_zero_on_empty_rows():
    from forge_nb.rl.losses import kl_k3, kl_penalty

    lp = torch.tensor([[-1.0, -2.0], [-0.5, 0.0]])
    ref = torch.tensor([[-1.5, -2.0], [-0.5, 0.0]])
    mask = torch.tensor([[1.0, 1.0], [0.0, 0.0]])  # the second row is empty
    k = kl_k3(lp, ref)
    expected = 0.1 * ((k[0, 0] + k[0, 1]) / 2 + 0.0) / 2
    assert torch.isclose(kl_penalty(lp, ref, mask, 0.1), expected)
    assert kl_penalty(lp, lp, mask, 0.1).item() == 0.0


def test_takes_ref_and_needs_ref_read_the_loss_signature():
    from forge_nb.rl.update import needs_ref, takes_ref

    def plain(logprobs, old_logprobs, advantages, mask): ...
    def with_ref(logprobs, old_logprobs, advantages, mask, ref_logprobs): ...
    def optional(logprobs, old_logprobs, advantages, mask, ref_logprobs=None): ...
    def kwargs(logprobs, old_logprobs, advantages, mask, **context): ...

    assert [takes_ref(f) for f in (plain, with_ref, optional, kwargs)] == [False, True, True, True]
    assert [needs_ref(f) for f in (plain, with_ref, optional, kwargs)] == [False, True, False, False]


def test_builtin_dr_grpo_loss_does_not_depend_on_the_prompt_length():
    """Same completions, logprobs and advantages behind a 3-token and a 40-token prompt: the same loss.
    (Dividing by the collated width instead of a constant would not give it.)"""
    from forge_nb.config import AlgorithmConfig
    from forge_nb.live.builtin import builtin_loss
    from forge_nb.live.capture import compile_function
    from forge_nb.rl.batch import collate

    completions = [[5, 6, 7], [8, 9], [5, 5, 5, 5, 5]]
    behaviour = [[-0.5, -1.0, -0.2], [-0.3, -0.9], [-0.1, -0.2, -0.3, -0.4, -0.5]]
    advantages = [1.0, -0.5, 0.25]
    loss = compile_function(builtin_loss(AlgorithmConfig(loss="dr_grpo", normalize_std=False), max_tokens=8))

    def value(prompt_length: int) -> float:
        batch = collate([[1] * prompt_length] * 3, completions, 0, behaviour, advantages)
        logprobs = (batch.old_logprobs + 0.05 * batch.completion_mask).requires_grad_(True)  # ratios != 1
        return loss(logprobs, batch.old_logprobs, batch.advantages, batch.completion_mask).item()

    short, long = value(3), value(40)
    assert short == pytest.approx(long, rel=1e-6)
    by_width = []
    for n in (3, 40):
        b = collate([[1] * n] * 3, completions, 0, behaviour, advantages)
        lp = b.old_logprobs + 0.05 * b.completion_mask
        by_width.append(dr_grpo_loss(lp, b.old_logprobs, b.advantages, b.completion_mask).item())
    assert by_width[0] != pytest.approx(by_width[1], rel=1e-3)  # the width-normalised form differs


def test_sapo_on_policy_gradient_is_the_policy_gradient():
    from forge_nb.rl.losses import sapo_loss

    logprobs = torch.tensor([[-1.0, -2.0], [-0.5, -0.1]], requires_grad=True)
    mask = torch.tensor([[1.0, 1.0], [1.0, 0.0]])
    adv = torch.tensor([1.0, -2.0])
    sapo_loss(logprobs, logprobs.detach(), adv, mask).backward()
    grpo = logprobs.detach().clone().requires_grad_(True)
    grpo_loss(grpo, grpo.detach(), adv, mask).backward()
    assert torch.allclose(logprobs.grad, grpo.grad)  # the gate's slope is 1 at ratio 1, whatever tau


def test_cispo_keeps_a_gradient_where_the_clip_would_take_it():
    from forge_nb.rl.losses import cispo_loss

    old = torch.zeros(1, 1)
    new = torch.full((1, 1), math.log(3.0), requires_grad=True)  # ratio 3, positive advantage
    grpo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1)).backward()
    assert new.grad.item() == 0.0  # clipped at 1.2: no gradient
    new.grad = None
    cispo_loss(new, old, torch.tensor([1.0]), torch.ones(1, 1), rho_max=2.0).backward()
    assert new.grad.item() == pytest.approx(-2.0)  # the weight is capped at 2, the token still learns


def test_gspo_takes_one_ratio_per_sequence():
    old = torch.zeros(1, 2)
    new = torch.tensor([[math.log(2.0), -math.log(2.0)]])  # token ratios 2 and 0.5, their mean log-ratio 0
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    assert grpo_loss(new, old, adv, mask, modifiers=Modifiers(ratio_level="sequence")).item() == pytest.approx(
        -1.0
    )  # ratio 1
    assert grpo_loss(new, old, adv, mask).item() == pytest.approx(-(1.2 + 0.5) / 2)  # per token: clipped at 1.2


def test_the_off_policy_mask_drops_stale_sequences_with_negative_advantage_only():
    from forge_nb.rl.losses import off_policy_keep

    old = torch.zeros(3, 2)
    new = torch.tensor([[-1.0, -1.0], [-1.0, -1.0], [-0.01, -0.01]])  # KL(old || new) ~ 1, 1, 0.01
    keep = off_policy_keep(new, old, torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2), threshold=0.5)
    assert keep.flatten().tolist() == [0.0, 1.0, 1.0]
    assert off_policy_keep(new, old, torch.tensor([-1.0, 1.0, -1.0]), torch.ones(3, 2), threshold=None) == 1.0


def test_a_ratio_level_that_is_not_one_is_refused():
    with pytest.raises(ValueError, match="ratio_level must be 'token' or 'sequence', got 'chunk'"):
        grpo_loss(
            torch.zeros(1, 1),
            torch.zeros(1, 1),
            torch.ones(1),
            torch.ones(1, 1),
            modifiers=Modifiers(ratio_level="chunk"),
        )


def test_top_entropy_quantile_trains_only_on_high_entropy_tokens_and_needs_the_entropies():
    logprobs = torch.tensor([[-1.0, -2.0, -0.5]], requires_grad=True)
    entropies = torch.tensor([[0.1, 2.0, 0.3]])
    top = Modifiers(top_entropy_quantile=0.3)
    loss = grpo_loss(
        logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 3), entropies=entropies, modifiers=top
    )
    loss.backward()
    assert logprobs.grad[0, 0] == 0 and logprobs.grad[0, 1] != 0 and logprobs.grad[0, 2] == 0
    with pytest.raises(ValueError, match="top_entropy_quantile=0.3 needs entropies"):
        grpo_loss(logprobs, logprobs.detach(), torch.tensor([1.0]), torch.ones(1, 3), modifiers=top)
