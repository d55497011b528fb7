import pytest
import torch

from forge_nb.config import AlgorithmConfig, TaskConfig
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import compile_function
from forge_nb.live.validate import LossProbe, validate_loss
from forge_nb.rl.losses import LOSSES


@pytest.mark.parametrize("name", list(LOSSES))
def test_every_builtin_loss_compiles_and_passes_validation(name):
    code = builtin_loss(AlgorithmConfig(loss=name), max_tokens=8)
    assert code.origin == f"built-in: {name}"
    lp = -torch.rand(3, 4)
    validate_loss(compile_function(code), LossProbe(lp, lp - 0.05, torch.tensor([1.0, -1.0, 0.5]), torch.ones(3, 4)), 5)


def test_builtin_reward_is_the_task_verifier():
    fn = compile_function(builtin_reward(TaskConfig()))
    assert fn("1+1=", "2", "2") == 1.0 and fn("1+1=", "3", "2") == 0.0
