"""forge_nb's built-in losses against TRL's own: the same GRPOConfig names, the same tensors, TRL's
`GRPOTrainer._compute_loss` (its shipped code, unchanged) on one side and forge_nb's loss v0 (the names mapped by
`Config.from_dict`, the source `builtin_loss` writes, compiled as a loss cell) on the other: equal loss and equal
gradient with respect to the policy's logprobs.

TRL's method is called on a stand-in for its trainer that holds only what the method reads (the model's forward is
replaced by the logprobs under test): a stub inside this unit test, not on any path a user runs.
"""

from __future__ import annotations

from collections import defaultdict
from types import SimpleNamespace

import pytest
import torch

from forge_nb.config import Config
from forge_nb.live.builtin import builtin_loss
from forge_nb.live.capture import compile_function

trl_grpo = pytest.importorskip("trl.trainer.grpo_trainer")

B, T = 6, 7


def _tensors(seed: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    mask = (torch.rand(B, T, generator=g) < 0.8).float()
    mask[:, 0] = 1.0
    mask[-1] = 0.0  # an empty row (a masked truncated completion)
    old = -torch.rand(B, T, generator=g) * 3
    return {
        "logprobs": old + torch.randn(B, T, generator=g) * 0.4,  # ratios from ~0.3 to ~3: both clips bite
        "old": old,
        "ref": old + torch.randn(B, T, generator=g) * 0.2,
        "advantages": torch.randn(B, generator=g),
        "mask": mask,
        "entropies": torch.rand(B, T, generator=g) * 2,  # the policy's per-token entropy (nats)
    }


def _trl_loss(values: dict, x: dict) -> tuple[float, torch.Tensor]:
    """TRL's `_compute_loss` on `x` with the GRPOConfig `values` -> (loss, d loss / d logprobs)."""
    args = trl_grpo.GRPOConfig(output_dir="/tmp/unused", use_cpu=True, max_completion_length=T, **values)
    logprobs = x["logprobs"].clone().requires_grad_(True)
    trainer = SimpleNamespace(
        _get_per_token_logps_and_entropies=lambda *a, **k: (logprobs, x["entropies"], None),
        aux_loss_enabled=False,
        top_entropy_quantile=args.top_entropy_quantile,
        off_policy_mask_threshold=args.off_policy_mask_threshold,
        get_off_policy_mask=trl_grpo.GRPOTrainer.get_off_policy_mask,
        get_gamma_weights=trl_grpo.GRPOTrainer.get_gamma_weights,
        importance_sampling_level=args.importance_sampling_level,
        beta=args.beta,
        args=args,
        loss_type=args.loss_type,
        epsilon_low=args.epsilon,
        epsilon_high=args.epsilon_high if args.epsilon_high is not None else args.epsilon,
        use_vllm=False,
        vllm_importance_sampling_correction=False,
        model=SimpleNamespace(training=True),
        current_gradient_accumulation_steps=1,
        max_completion_length=args.max_completion_length,
        accelerator=SimpleNamespace(
            num_processes=1,
            gather=lambda t: t,
            gather_for_metrics=lambda t: t,
            reduce=lambda t, reduction: t,
            pad_across_processes=lambda t, dim, pad_index: t,
        ),
        _entropy_bonus_enabled=False,
        _metrics={"train": defaultdict(list)},
    )
    trainer.get_high_entropy_mask = lambda *a: trl_grpo.GRPOTrainer.get_high_entropy_mask(trainer, *a)
    inputs = {
        "prompt_ids": torch.zeros(B, 1, dtype=torch.long),
        "prompt_mask": torch.ones(B, 1),
        "completion_ids": torch.zeros(B, T, dtype=torch.long),
        "completion_mask": x["mask"],
        "advantages": x["advantages"],
        "old_per_token_logps": x["old"],
        "ref_per_token_logps": x["ref"],
        "num_items_in_batch": x["mask"].sum(),
    }
    loss = trl_grpo.GRPOTrainer._compute_loss(trainer, None, inputs)
    loss.backward()
    return loss.item(), logprobs.grad


def _forge_nb_loss(values: dict, x: dict) -> tuple[float, torch.Tensor]:
    """Loss v0 of the config these GRPOConfig names make -> (loss, d loss / d logprobs)."""
    config = Config.from_dict({"max_completion_length": T, **values})
    loss_fn = compile_function(builtin_loss(config.algorithm, config.engine.max_tokens))
    logprobs = x["logprobs"].clone().requires_grad_(True)
    extra = {"ref_logprobs": x["ref"]} if config.algorithm.kl_coef > 0 else {}
    if config.algorithm.top_entropy_quantile < 1:
        extra["entropies"] = x["entropies"]
    loss = loss_fn(logprobs, x["old"], x["advantages"], x["mask"], **extra)
    loss.backward()
    return loss.item(), logprobs.grad


LOSS_TYPES = ["grpo", "bnpo", "dr_grpo", "dapo", "cispo", "sapo", "luspo", "vespo"]
OPTIONS = {
    "plain": {},
    "gspo": {"importance_sampling_level": "sequence"},
    "kl": {"beta": 0.04, "use_bias_correction_kl": False},
    "kl_unbiased": {"beta": 0.04, "use_bias_correction_kl": True},  # TRL 1.16's default
    "opsm": {"off_policy_mask_threshold": 0.05},
    "gspo+kl+opsm": {"importance_sampling_level": "sequence", "beta": 0.04, "use_bias_correction_kl": True,
                     "off_policy_mask_threshold": 0.05},
    "top_entropy": {"top_entropy_quantile": 0.2},
    "gspo+kl+opsm+top_entropy": {"importance_sampling_level": "sequence", "beta": 0.04, "use_bias_correction_kl": True,
                                 "off_policy_mask_threshold": 0.05, "top_entropy_quantile": 0.5},
}  # fmt: skip


@pytest.mark.parametrize("options", list(OPTIONS), ids=list(OPTIONS))
@pytest.mark.parametrize("loss_type", LOSS_TYPES)
def test_every_loss_type_and_option_is_trls_loss_and_gradient(loss_type, options):
    values = {"loss_type": loss_type, "epsilon": 0.2, **OPTIONS[options]}
    values |= {"epsilon_high": 5.0 if loss_type == "cispo" else 0.28}  # asymmetric for every clipped loss, as TRL
    for seed in range(3):
        x = _tensors(seed)
        trl_value, trl_grad = _trl_loss(values, x)
        value, grad = _forge_nb_loss(values, x)
        assert value == pytest.approx(trl_value, rel=1e-5, abs=1e-7), (seed, value, trl_value)
        assert torch.allclose(grad, trl_grad, rtol=1e-5, atol=1e-7), (seed, (grad - trl_grad).abs().max())


@pytest.mark.parametrize("loss_type", ["grpo", "bnpo", "dr_grpo", "dapo", "luspo"])
def test_intellect2_delta_caps_the_unclipped_ratio_as_trl_does(loss_type):
    values = {"loss_type": loss_type, "delta": 1.5, "epsilon_high": None}
    x = _tensors(7)
    x["advantages"] = -x["advantages"].abs()  # delta acts where A < 0 and the ratio is large
    trl_value, trl_grad = _trl_loss(values, x)
    value, grad = _forge_nb_loss(values, x)
    assert value == pytest.approx(trl_value, rel=1e-5)
    assert torch.allclose(grad, trl_grad, rtol=1e-5, atol=1e-7)
    assert value != pytest.approx(_forge_nb_loss({"loss_type": loss_type}, x)[0], rel=1e-3)  # it did bite


def test_sapo_temperatures_as_trl_sets_them():
    values = {"loss_type": "sapo", "sapo_temperature_pos": 0.5, "sapo_temperature_neg": 2.0}
    x = _tensors(11)
    trl_value, trl_grad = _trl_loss(values, x)
    value, grad = _forge_nb_loss(values, x)
    assert value == pytest.approx(trl_value, rel=1e-5)
    assert torch.allclose(grad, trl_grad, rtol=1e-5, atol=1e-7)


def test_vespo_shapes_as_trl_sets_them():
    values = {"loss_type": "vespo", "vespo_k_pos": 1.5, "vespo_lambda_pos": 2.5, "vespo_k_neg": 4.0}
    x = _tensors(13)
    trl_value, trl_grad = _trl_loss(values, x)
    value, grad = _forge_nb_loss(values, x)
    assert value == pytest.approx(trl_value, rel=1e-5)
    assert torch.allclose(grad, trl_grad, rtol=1e-5, atol=1e-7)
    assert value != pytest.approx(_forge_nb_loss({"loss_type": "vespo"}, x)[0], rel=1e-3)  # they took effect
