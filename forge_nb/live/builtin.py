"""Version 0 of the reward and the loss, written as live code so they travel the same path."""

from __future__ import annotations

from forge_nb.config import AlgorithmConfig, TaskConfig
from forge_nb.live.capture import LiveCode


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
    """The configured loss of the GRPO family (`algorithm.loss`) with its options, as loss v0.
    Dr.GRPO divides by B x `max_tokens` (engine.max_tokens, a constant), as the paper and TRL do."""
    a = algorithm
    options = {
        "grpo": f"clip_eps={a.clip_eps}, token_level={a.token_level}",
        "dr_grpo": f"clip_eps={a.clip_eps}, max_tokens={max_tokens}",
        "dapo": f"clip_low={a.clip_eps}, clip_high={a.clip_high}",
        "aipo": f"rho_max={a.rho_max}",
    }[a.loss]
    if a.kl_coef > 0:  # the same loss plus beta x k3 KL to the reference actor's logprobs
        source = (
            f"from forge_nb.rl.losses import {a.loss}_loss, kl_penalty\n\n\n"
            "def loss(logprobs, old_logprobs, advantages, mask, ref_logprobs):\n"
            f"    surrogate = {a.loss}_loss(logprobs, old_logprobs, advantages, mask, {options})\n"
            f"    return surrogate + kl_penalty(logprobs, ref_logprobs, mask, beta={a.kl_coef})\n"
        )
        return LiveCode("loss", "loss", source, f"built-in: {a.loss} + {a.kl_coef} x KL(reference)")
    source = (
        f"from forge_nb.rl.losses import {a.loss}_loss\n\n\n"
        "def loss(logprobs, old_logprobs, advantages, mask):\n"
        f"    return {a.loss}_loss(logprobs, old_logprobs, advantages, mask, {options})\n"
    )
    # Every loss of the family is advantage x f(ratio) per token: 0, with no gradient, where A = 0.
    return LiveCode("loss", "loss", source, f"built-in: {a.loss}", zero_advantage_inert=True)
