"""TRL's GRPOConfig names as forge_nb config: aliases, disagreements, and a whole GRPOConfig.to_dict()."""

import warnings

import pytest

from forge_nb.config import Config, ConfigError, TRLConfigWarning


def test_trl_names_set_the_forge_nb_fields():
    c = Config.from_dict(
        {"num_generations": 4, "max_completion_length": 32, "learning_rate": 1e-5, "beta": 0.04, "epsilon": 0.1,
         "temperature": 0.7, "top_p": 0.9, "scale_rewards": "none", "reward_weights": [1, 0.5]}
    )  # fmt: skip
    a, e = c.algorithm, c.engine
    assert (a.group_size, e.max_tokens, a.lr, a.kl_coef, a.clip_eps) == (4, 32, 1e-5, 0.04, 0.1)
    assert (e.temperature, e.top_p, a.normalize_std, a.reward_weights) == (0.7, 0.9, False, [1.0, 0.5])
    gdpo = Config.from_dict({"multi_objective_aggregation": "normalize_then_sum"}).algorithm
    assert gdpo.reward_aggregation == "normalize_then_sum" and a.reward_aggregation == "sum_then_normalize"
    with pytest.raises(ConfigError, match="algorithm.reward_aggregation must be one of"):
        Config.from_dict({"multi_objective_aggregation": "sum"})


@pytest.mark.parametrize(
    ("loss_type", "loss", "token_level"),
    [("grpo", "grpo", False), ("bnpo", "grpo", True), ("dr_grpo", "dr_grpo", False), ("dapo", "dapo", False),
     ("cispo", "cispo", False), ("sapo", "sapo", False), ("luspo", "luspo", False), ("vespo", "vespo", False)],
)  # fmt: skip
def test_each_trl_loss_type_is_the_forge_nb_loss_with_the_same_normalisation(loss_type, loss, token_level):
    a = Config.from_dict({"loss_type": loss_type}).algorithm
    assert (a.loss, a.token_level) == (loss, token_level)


def test_clip_higher_and_its_none_default():
    assert Config.from_dict({"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": 0.28}).algorithm.clip_high == 0.28
    assert Config.from_dict({"loss_type": "dapo", "epsilon": 0.2, "epsilon_high": None}).algorithm.clip_high == 0.2
    # TRL clips every clipped loss at 1 + epsilon_high (GSPO's recipe: grpo, epsilon 3e-4, epsilon_high 4e-4)
    gspo = Config.from_dict({"loss_type": "grpo", "epsilon": 3e-4, "epsilon_high": 4e-4}).algorithm
    assert (gspo.clip_eps, gspo.upper_clip) == (3e-4, 4e-4)
    assert Config.from_dict({"loss": "grpo", "clip_eps": 0.1}).algorithm.upper_clip == 0.1  # forge_nb's defaults
    assert Config.from_dict({"loss": "dapo"}).algorithm.upper_clip == 0.28


def test_cispo_takes_its_weight_cap_from_epsilon_high_as_trl_does():
    assert Config.from_dict({"loss_type": "cispo", "epsilon_high": 5.0}).algorithm.rho_max == 5.0
    assert Config.from_dict({"loss_type": "cispo", "epsilon": 0.2, "epsilon_high": None}).algorithm.rho_max == 0.2
    assert Config.from_dict({"loss_type": "cispo"}).algorithm.rho_max == 0.2  # TRL: epsilon when not given
    assert Config.from_dict({"algorithm": {"loss": "cispo"}, "epsilon_high": 5.0}).algorithm.rho_max == 5.0
    assert Config.from_dict({"loss": "cispo"}).algorithm.rho_max == 2.0  # forge_nb's own name, forge_nb's default
    assert Config.from_dict({"loss_type": "dapo", "epsilon_high": None}).algorithm.upper_clip == 0.2  # = epsilon


def test_gspo_and_the_other_loss_options_from_their_trl_names():
    a = Config.from_dict(
        {"importance_sampling_level": "sequence", "delta": 4.0, "off_policy_mask_threshold": 0.5,
         "sapo_temperature_pos": 0.9, "sapo_temperature_neg": 1.1, "mask_truncated_completions": True}
    ).algorithm  # fmt: skip
    assert (a.ratio_level, a.clip_delta, a.off_policy_mask) == ("sequence", 4.0, 0.5)
    assert (a.sapo_tau_pos, a.sapo_tau_neg, a.mask_truncated) == (0.9, 1.1, True)
    off = Config.from_dict({"delta": None, "off_policy_mask_threshold": None}).algorithm
    assert (off.clip_delta, off.off_policy_mask) == (0.0, None)
    assert Config.from_dict({"off_policy_mask_threshold": 0.0}).algorithm.off_policy_mask == 0.0  # on, as in TRL


def test_scale_rewards_group_batch_or_none():
    for value, expected in (("group", (True, "group")), ("batch", (True, "batch")), ("none", (False, "group"))):
        a = Config.from_dict({"scale_rewards": value}).algorithm
        assert (a.normalize_std, a.std_over) == expected, value


def test_generation_batch_size_over_num_generations_is_prompts_per_step():
    a = Config.from_dict({"generation_batch_size": 16, "num_generations": 4}).algorithm
    assert (a.prompts_per_step, a.group_size) == (4, 4)


def test_num_iterations_and_steps_per_generation_are_epochs_and_mini_batches():
    """TRL reuses a generation batch for steps_per_generation micro-steps, num_iterations times, an optimizer
    step every gradient_accumulation_steps of them."""
    values = {"num_iterations": 3, "steps_per_generation": 8, "gradient_accumulation_steps": 4}
    a = Config.from_dict(values).algorithm
    assert (a.epochs, a.mini_batches) == (3, 2)
    assert Config.from_dict({"steps_per_generation": 2}).algorithm.mini_batches == 2  # no accumulation


@pytest.mark.parametrize(
    ("values", "message"),
    [
        ({"learning_rate": 1e-5, "lr": 1e-4}, r"learning_rate=1e-05 \(TRL's name for algorithm.lr: 1e-05\) disagrees "
         r"with lr=0.0001"),
        ({"num_generations": 4, "algorithm": {"group_size": 8}}, r"num_generations=4 .* disagrees with "
         r"algorithm\['group_size'\]=8"),
        ({"max_completion_length": 32, "engine.max_tokens": 16}, "disagrees with engine.max_tokens=16"),
        ({"loss_type": "bnpo", "token_level": False}, r"loss_type='bnpo' .*algorithm.token_level: True\) disagrees"),
        ({"loss_type": "ppo"}, "loss_type='ppo' is not in forge_nb; it has 'grpo', 'bnpo'"),
        ({"importance_sampling_level": "chunk"}, "algorithm.ratio_level must be one of \\['token', 'sequence'\\]"),
        ({"delta": 0.5}, "algorithm.clip_delta caps the ratio: > 1"),
        ({"loss_type": "sapo", "delta": 4.0}, "clip_delta caps a clipped loss.s ratio; loss .sapo. clips none"),
        ({"scale_rewards": "batch", "std_over": "group"}, "scale_rewards='batch' .* disagrees with std_over='group'"),
        ({"scale_rewards": "max"}, "scale_rewards='max': forge_nb divides advantages by their group's std"),
        ({"generation_batch_size": 10, "num_generations": 4}, "needs num_generations \\(a divisor of it\\)"),
        ({"steps_per_generation": 6, "gradient_accumulation_steps": 4}, "not a multiple of gradient_accumulation"),
        ({"num_iterations": 0}, "algorithm.epochs must be >= 1, got 0"),
    ],
)  # fmt: skip
def test_disagreements_and_what_forge_nb_lacks_are_one_clear_error(values, message):
    with pytest.raises(ConfigError, match=message):
        Config.from_dict(values)


def test_agreeing_names_are_fine():
    assert Config.from_dict({"learning_rate": 1e-5, "lr": 1e-5}).algorithm.lr == 1e-5


def test_a_whole_grpo_config_maps_what_forge_nb_has_and_names_what_it_ignores():
    trl = pytest.importorskip("trl")
    values = trl.GRPOConfig(
        use_cpu=True, learning_rate=2e-5, num_generations=4, max_completion_length=24, loss_type="dr_grpo",
        scale_rewards="none", beta=0.02, num_iterations=2, top_entropy_quantile=0.2, mask_truncated_completions=True,
        top_k=5,
    ).to_dict()  # fmt: skip
    with pytest.warns(TRLConfigWarning) as caught:
        c = Config.from_dict(values)
    # (the recorder also sees any other warning raised meanwhile, from any thread: a CI run once counted 5)
    ours = [w for w in caught if issubclass(w.category, TRLConfigWarning)]
    assert len(ours) == 1, [str(w.message) for w in caught]
    message = str(ours[0].message)
    assert "top_k=5" in message
    assert "top_entropy_quantile" not in message and c.algorithm.top_entropy_quantile == 0.2  # the same name
    assert "mask_truncated" not in message and c.algorithm.mask_truncated  # mapped, not ignored
    assert "num_iterations" not in message and c.algorithm.epochs == 2
    assert "output_dir" not in message and "learning_rate" not in message and "use_cpu" not in message
    a = c.algorithm
    assert (a.lr, a.group_size, c.engine.max_tokens, a.loss, a.normalize_std, a.kl_coef) == (
        2e-5, 4, 24, "dr_grpo", False, 0.02
    )  # fmt: skip
    assert a.prompts_per_step == 2 and c.seed == 42  # TRL's 8 completions per step / 4; its seed


def test_trl_defaults_alone_warn_about_nothing():
    trl = pytest.importorskip("trl")
    with warnings.catch_warnings():
        warnings.simplefilter("error", TRLConfigWarning)
        c = Config.from_dict(trl.GRPOConfig(use_cpu=True).to_dict())
    assert (c.algorithm.loss, c.algorithm.lr, c.engine.max_tokens) == ("dapo", 1e-6, 512)


def test_an_unknown_name_that_is_not_trls_is_still_an_error():
    with pytest.raises(ConfigError, match="unknown config field 'learning_rat'"):
        Config.from_dict({"learning_rat": 1e-5})
