"""Version 0 of the reward and the loss, written as live code so they travel the same path."""

from __future__ import annotations

from forge_nb.config import AlgorithmConfig, TaskConfig
from forge_nb.live.capture import LiveCode
from forge_nb.rl.losses import LOSSES


def builtin_reward(task: TaskConfig) -> LiveCode:
    """The task's verifier as reward v0: exact match for the bundled addition task; for a dataset,
    the final answer (boxed, else the last number, else the text) against the answer column."""
    check = {"addition": ("forge_nb.tasks.arithmetic", "exact_match")}.get(
        task.name, ("forge_nb.rewards", "answer_match")
    )
    source = (
        f"from {check[0]} import {check[1]}\n\n\n"
        "def reward(prompt, completion, target, **context):\n"
        f"    return {check[1]}(completion, target)\n"
    )
    return LiveCode("reward", "reward", source, f"built-in: {task.name} verifier ({check[1]})")


def builtin_loss(algorithm: AlgorithmConfig, max_tokens: int) -> LiveCode:
    """Loss v0: the function `LOSSES[algorithm.loss]` names, with its options read from `algorithm`
    (and `max_tokens`, engine.max_tokens), written as source that imports it by name, so it travels
    and is checked like a loss cell. `kl_coef > 0` adds beta x the k3 KL to the reference's logprobs."""
    a = algorithm
    chosen = LOSSES[a.loss]
    fn = chosen.fn.__name__
    options = ", ".join(
        f"{keyword}={max_tokens if field == 'max_tokens' else getattr(a, field)!r}"
        for keyword, field in chosen.options.items()
    )
    if a.kl_coef > 0:
        source = (
            f"from forge_nb.rl.losses import {fn}, kl_penalty\n\n\n"
            "def loss(logprobs, old_logprobs, advantages, mask, ref_logprobs):\n"
            f"    surrogate = {fn}(logprobs, old_logprobs, advantages, mask, {options})\n"
            f"    return surrogate + kl_penalty(logprobs, ref_logprobs, mask, beta={a.kl_coef})\n"
        )
        return LiveCode("loss", "loss", source, f"built-in: {a.loss} + {a.kl_coef} x KL(reference)")
    source = (
        f"from forge_nb.rl.losses import {fn}\n\n\n"
        "def loss(logprobs, old_logprobs, advantages, mask):\n"
        f"    return {fn}(logprobs, old_logprobs, advantages, mask, {options})\n"
    )
    # Every loss of the family is advantage x f(ratio) per token: 0, with no gradient, where A = 0.
    return LiveCode("loss", "loss", source, f"built-in: {a.loss}", zero_advantage_inert=True)
