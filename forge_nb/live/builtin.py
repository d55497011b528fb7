"""Version 0 of the reward and the loss, written as live code so they travel the same path."""

from __future__ import annotations

from forge_nb.config import AlgorithmConfig, TaskConfig
from forge_nb.live.capture import LiveCode


def builtin_reward(task: TaskConfig, seed: int) -> LiveCode:
    """The task's exact verifier as reward v0."""
    source = (
        "from forge_nb.tasks import make_task\n\n"
        f"_task = make_task({task.name!r}, {seed}, max_digits={task.max_digits}, eval_size=1)\n\n\n"
        "def reward(prompt, completion, target, **context):\n"
        "    return _task.verify(completion, target)\n"
    )
    return LiveCode("reward", "reward", source, f"built-in: {task.name} verifier")


def builtin_loss(algorithm: AlgorithmConfig) -> LiveCode:
    """The clipped GRPO loss with the configured options as loss v0."""
    source = (
        "from forge_nb.rl.losses import grpo_loss\n\n\n"
        "def loss(logprobs, old_logprobs, advantages, mask):\n"
        f"    return grpo_loss(logprobs, old_logprobs, advantages, mask, clip_eps={algorithm.clip_eps}, "
        f"token_level={algorithm.token_level})\n"
    )
    return LiveCode("loss", "loss", source, "built-in: GRPO")
