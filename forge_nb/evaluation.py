"""The policy on the task's held-out prompts: greedy accuracy, and probe samples for live code.

Held-out prompts are never trained on; neither are the samples made here (they are not stored).
"""

from __future__ import annotations

import torch

from forge_nb.engines.base import SamplingParams
from forge_nb.mesh.roles import Roles
from forge_nb.rl.advantages import group_relative
from forge_nb.rl.episode import Episode
from forge_nb.rl.rollout import make_episodes
from forge_nb.tasks.base import Task


def heldout_accuracy(actors: Roles, task: Task, max_tokens: int) -> dict[str, float]:
    """Greedy accuracy on `task`'s held-out set under the weights the generator serves now ->
    policy_version, heldout_accuracy, eval_s (seconds of generation)."""
    problems = task.eval_set()
    generation = actors.generate(
        [p.prompt for p in problems], SamplingParams(n=1, temperature=0.0, max_tokens=max_tokens)
    )
    correct = [task.verify(c[0].text, p.target) for c, p in zip(generation.completions, problems)]
    return {
        "policy_version": generation.policy_version,
        "heldout_accuracy": sum(correct) / len(correct),
        "eval_s": generation.seconds,
    }


def probe_samples(actors: Roles, task: Task, sampling: SamplingParams, n: int) -> list[Episode]:
    """`n` fresh samples of held-out prompts (groups of `sampling.n`), scored by the task's verifier,
    with group-relative advantages: what a candidate reward or loss is validated on before the
    first rollout."""
    group = sampling.n
    problems = task.eval_set()[: -(-n // group)]
    generation = actors.generate([p.prompt for p in problems], sampling)
    episodes = make_episodes(problems, generation.completions, generation.policy_version, None)
    rewards = torch.tensor([task.verify(e.completion, e.target) for e in episodes])
    advantages = group_relative(rewards.view(len(problems), group)).flatten().tolist()
    for e, r, a in zip(episodes, rewards.tolist(), advantages):
        e.reward, e.advantage = r, a
    return episodes[:n]
