"""Version 0 of the reward and the loss, written as live code so they travel the same path."""

from __future__ import annotations

import inspect

from forge_nb.config import AlgorithmConfig, TaskConfig
from forge_nb.live.capture import LiveCode
from forge_nb.rl.losses import LOSSES, Modifiers


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
    """Loss v0: the function `LOSSES[algorithm.loss]` names, with its options read from `algorithm` (and
    `max_tokens`, engine.max_tokens; an optional one, or a modifier, only when it is not the default), written as
    source that imports it by name, so it travels and is checked like a loss cell. `kl_coef > 0` passes the
    reference's logprobs and ``Modifiers(beta=kl_coef)``: the loss adds beta x the k3 KL per token."""
    a = algorithm
    chosen = LOSSES[a.loss]
    fn = chosen.fn.__name__
    defaults = inspect.signature(chosen.fn).parameters
    options = [
        f"{keyword}={max_tokens if field == 'max_tokens' else getattr(a, field)!r}"
        for keyword, field in chosen.options.items()
    ]
    optional = [f"{k}={getattr(a, f)!r}" for k, f in chosen.optional.items() if getattr(a, f) != defaults[k].default]
    plain = Modifiers()
    modifiers = [f"{k}={getattr(a, f)!r}" for k, f in chosen.modifiers.items() if getattr(a, f) != getattr(plain, k)]
    label = ", ".join([a.loss, *optional, *modifiers])  # the origin names what differs from the plain loss
    params = ["logprobs", "old_logprobs", "advantages", "mask"]
    options += optional
    if a.kl_coef > 0:
        params.append("ref_logprobs")
        options.append("ref_logprobs=ref_logprobs")
        modifiers += [f"beta={a.kl_coef!r}"] + (["kl_unbiased=True"] if a.kl_unbiased else [])
        label += f" + {a.kl_coef} x KL(reference)"
    if a.top_entropy_quantile < 1:
        params.append("entropies")  # the trainer passes the policy's per-token entropies to a loss that names them
        options.append("entropies=entropies")
    imports = fn
    if modifiers:
        options.append(f"modifiers=Modifiers({', '.join(modifiers)})")
        imports += ", Modifiers"
    source = (
        f"from forge_nb.rl.losses import {imports}\n\n\n"
        f"def loss({', '.join(params)}):\n"
        f"    return {fn}(logprobs, old_logprobs, advantages, mask, {', '.join(options)})\n"
    )
    # Every loss of the family is advantage x f(ratio) per token: 0, with no gradient, where A = 0 and where the
    # mask is 0; not so with the KL term, nor with the entropy quantile (taken over every row's tokens).
    inert = a.kl_coef == 0 and a.top_entropy_quantile == 1
    return LiveCode("loss", "loss", source, f"built-in: {label}", zero_advantage_inert=inert)
