import pytest
import torch

from forge_nb.rl.advantages import decoupled, group_relative


def test_group_relative_by_hand():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0], [1.0, 1.0, 1.0, 0.0]])
    adv = group_relative(rewards, eps=0.0)
    # group 0: mean 0.5, population std 0.5 -> +-1; group 1: mean 0.75, std sqrt(3)/4.
    assert torch.allclose(adv[0], torch.tensor([1.0, -1.0, -1.0, 1.0]))
    s = 3**0.5 / 4
    assert torch.allclose(adv[1], torch.tensor([0.25 / s, 0.25 / s, 0.25 / s, -0.75 / s]))


def test_all_equal_group_gets_zero_advantage():
    adv = group_relative(torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]))
    assert torch.equal(adv, torch.zeros(2, 3))


def test_without_std_only_the_mean_is_removed():
    adv = group_relative(torch.tensor([[2.0, 0.0]]), normalize_std=False)
    assert torch.equal(adv, torch.tensor([[1.0, -1.0]]))


def test_dynamic_sampling_drops_groups_whose_rewards_are_all_equal():
    from forge_nb.rl.advantages import informative_groups

    rewards = torch.tensor([[1.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 0.0]])
    assert informative_groups(rewards).tolist() == [False, True, False]


def test_overlong_penalty_ramps_from_zero_to_minus_one():
    from forge_nb.rl.advantages import overlong_penalty

    lengths = torch.tensor([4, 6, 7, 8, 9])
    # max 8, cache 2: no penalty up to 6, -0.5 at 7, -1 at 8 and beyond
    assert overlong_penalty(lengths, max_tokens=8, cache=2).tolist() == [0.0, 0.0, -0.5, -1.0, -1.0]


def test_masked_group_relative_ignores_failed_samples():
    rewards = torch.tensor([[1.0, 0.0, 5.0]])
    valid = torch.tensor([[True, True, False]])
    adv = group_relative(rewards, eps=0.0, valid=valid)
    assert torch.allclose(adv, torch.tensor([[1.0, -1.0, 0.0]]))


def test_sample_std_is_bessel_corrected_and_a_group_of_one_still_gives_zero():
    rewards = torch.tensor([[1.0, 0.0, 0.0, 1.0]])
    adv = group_relative(rewards, eps=0.0, unbiased=True)  # std with n - 1: sqrt(1 / 3)
    assert torch.allclose(adv, torch.tensor([[1.0, -1.0, -1.0, 1.0]]) * 0.5 / (1 / 3) ** 0.5)
    single = group_relative(torch.tensor([[3.0, 1.0]]), valid=torch.tensor([[True, False]]), unbiased=True)
    assert torch.equal(single, torch.zeros(1, 2))


def test_batch_std_is_trls_scale_rewards_batch():
    """A group's mean, one std of every reward of the batch: TRL's own expression (its nanstd), eps aside."""
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    rewards = torch.tensor([[1.0, 0.0, 0.0, 0.0], [0.5, 0.5, 0.5, 0.6], [2.0, 0.0, 1.0, 1.0]])
    trl = (rewards - rewards.mean(1, keepdim=True)) / (nanstd(rewards.flatten()) + 1e-4)
    assert torch.allclose(group_relative(rewards, eps=1e-4, unbiased=True, std_over="batch"), trl, atol=1e-6)
    by_group = group_relative(rewards, unbiased=True)
    assert by_group[1].abs().max() > 1.0 > trl[1].abs().max()  # a group that barely differs is not blown up


def test_batch_std_leaves_failed_rewards_out():
    rewards = torch.tensor([[1.0, 0.0], [3.0, 100.0]])
    valid = torch.tensor([[True, True], [True, False]])
    out = group_relative(rewards, eps=0.0, valid=valid, unbiased=True, std_over="batch")
    std = torch.tensor([1.0, 0.0, 3.0]).std()
    assert torch.allclose(out, torch.tensor([[0.5 / std, -0.5 / std], [0.0, 0.0]]))


def test_gdpo_is_trls_normalize_then_sum():
    """TRL's own expression for multi_objective_aggregation="normalize_then_sum" (its nanstd), with rewards that
    did not score a sample (NaN), one that scored a single sample of a group, and a sample nothing scored."""
    nanstd = pytest.importorskip("trl.trainer.utils").nanstd
    torch.manual_seed(0)
    P, G, K = 3, 4, 3
    components = torch.rand(P, G, K)
    components[0, 1, 1] = components[1, 2, :] = components[2, :, 0] = float("nan")
    components[2, 1:, 2] = float("nan")  # the third reward scored one sample of the last group
    weights = torch.tensor([1.0, 0.5, 2.0])
    mean_k = torch.nanmean(components, dim=1, keepdim=True)
    reward_k = ((components - mean_k) / (nanstd(components, dim=1, keepdim=True) + 1e-4)).view(-1, K)
    rewards = (reward_k * weights.unsqueeze(0)).nansum(dim=1)
    rewards[torch.isnan(components.view(-1, K)).all(dim=1)] = torch.nan
    trl = torch.nan_to_num((rewards - torch.nanmean(rewards)) / (nanstd(rewards) + 1e-4), nan=0.0).view(P, G)
    assert torch.allclose(decoupled(components, weights), trl, atol=1e-6)
    assert decoupled(components, weights)[1, 2] == 0  # scored by none


def test_gdpo_keeps_a_narrow_reward_from_drowning_in_a_wide_one():
    """A correctness reward of 0 or 100 beside a format reward of 0 or 1: summed first, the format barely moves
    an advantage; normalised first, each moves it as much."""
    correct, formatted = torch.tensor([[0.0, 0.0, 100.0, 100.0]]), torch.tensor([[1.0, 0.0, 1.0, 0.0]])
    summed = group_relative(correct + formatted, unbiased=True)
    gdpo = decoupled(torch.stack([correct, formatted], dim=-1), torch.tensor([1.0, 1.0]))
    assert (summed[0, 0] - summed[0, 1]).abs() < 0.03
    format_gap, correct_gap = (gdpo[0, 0] - gdpo[0, 1]).item(), (gdpo[0, 2] - gdpo[0, 0]).item()
    assert format_gap == pytest.approx(correct_gap, rel=1e-3) and format_gap > 1
