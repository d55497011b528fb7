import math
import time

import pytest
import torch

from forge_nb.checks import CheckFailed
from forge_nb.live.validate import LossProbe, validate_loss, validate_reward
from forge_nb.rewards.batch import RewardSample
from forge_nb.rl.losses import grpo_loss

PROBES = [RewardSample("1+1=", "2", "2", {"step": 0}), RewardSample("2+2=", "5", "4", {"step": 0})]


def _probe() -> LossProbe:
    lp = -torch.rand(3, 4)
    return LossProbe(lp, lp - 0.05, torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 4))


def test_a_good_reward_returns_one_float_per_sample():
    assert validate_reward(lambda p, c, t, **k: float(c == t), PROBES, 1.0) == [1.0, 0.0]


def brief(completion):
    return float(completion.isdigit())


def right_step(completion, target, step):
    return float(completion == target) + step


def test_a_reward_takes_only_the_fields_it_names_or_all_three_positionally():
    assert validate_reward(brief, PROBES, 1.0) == [1.0, 1.0]
    assert validate_reward(right_step, PROBES, 1.0) == [1.0, 0.0]
    assert validate_reward(lambda p, c, t: float(c == t), PROBES, 1.0) == [1.0, 0.0]  # any names, in order


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda p, c, t, **k: 1 / 0, r"raised ZeroDivisionError: division by zero.*probe sample 0"),
        (lambda p, c, t, **k: None, r"returned NoneType None; expected a float for probe sample 0"),
        (lambda p, c, t, **k: "1.0", r"returned str '1.0'; expected a float"),
        (lambda p, c, t, **k: [1.0], r"returned list \[1.0\]; expected a float"),
        (lambda p, c, t, **k: math.nan, r"returned nan; expected a finite float"),
        (lambda p, c, t, **k: -math.inf, r"returned -inf; expected a finite float"),
        (lambda p, c, t, **k: time.sleep(2), r"did not return within the 0.2 s timeout"),
    ],
)
def test_a_bad_reward_is_refused_with_the_cause(fn, message):
    with pytest.raises(CheckFailed, match=message):
        validate_reward(fn, PROBES, 0.2)


def test_the_builtin_loss_passes():
    assert math.isfinite(validate_loss(grpo_loss, _probe(), 1.0))


@pytest.mark.parametrize(
    ("fn", "message"),
    [
        (lambda lp, old, adv, m: (lp * m).sum(1), r"shape \(3,\); expected a scalar"),
        (lambda lp, old, adv, m: (old * m).sum(), r"does not require grad"),
        (lambda lp, old, adv, m: lp.sum() * math.nan, r"returned nan; expected a finite value"),
        (lambda lp, old, adv, m: 1.0, r"returned float 1.0; expected a scalar torch.Tensor"),
        (lambda lp, old, adv, m: lp.sum() + torch.sqrt(lp * 0).sum(), r"non-finite gradients"),
        (lambda lp, old, adv, m: lp.undefined(), r"raised AttributeError"),
    ],
)
def test_a_bad_loss_is_refused_with_the_cause(fn, message):
    with pytest.raises(CheckFailed, match=message):
        validate_loss(fn, _probe(), 1.0)
