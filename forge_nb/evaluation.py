"""The policy on the task's held-out prompts: scored by the live rewards and the task's verifier;
and probe samples for validating live code.

Held-out prompts are never trained on; neither are the samples made here (they are not stored).
"""

from __future__ import annotations

import dataclasses
import math
import time

import torch

from forge_nb.actors.env import AgentCode
from forge_nb.agents.episodes import episodes_of, row_of, trajectory_ends
from forge_nb.agents.trajectory import Trajectory
from forge_nb.engines.base import SamplingParams
from forge_nb.fleet.fleet import Fleet
from forge_nb.rl.advantages import group_relative
from forge_nb.rl.episode import Episode
from forge_nb.rl.pipeline import apply_scores, make_episodes, reward_batch
from forge_nb.state import RunState
from forge_nb.tasks.prompts import PromptFormat

PROBE_ROWS = 2  # held-out rows a candidate agent rollout is checked on


def evaluate(fleet: Fleet, state: RunState, max_tokens: int | None = None, greedy: bool | None = None) -> dict:
    """Every held-out prompt under the weights the generator serves now: greedy (one completion
    each) or sampled (`eval.samples_per_prompt` each, at engine.temperature), per `config.eval`
    or `greedy` when given.

    -> policy_version; heldout_accuracy (the task's verifier) and heldout_se, its standard error over the
    eval_problems prompts (each prompt's share correct is one observation); eval_reward (the live weighted
    reward) and eval_reward/<member> for each reward member; eval_failed (samples a reward failed
    on); truncated (share that hit max_tokens); eval_samples; eval_greedy (1.0 or 0.0); eval_s (generation
    seconds). With an agent rollout live, each held-out prompt runs as trajectories of it. The result is
    also an "eval" row of the metrics stream."""
    config, task, step = state.config, state.task, state.step_count
    e, engine = config.eval, config.engine
    if greedy is not None:  # this call only
        e = dataclasses.replace(e, greedy=greedy)
    problems = task.eval_set()
    sampling = engine.sampling(1 if e.greedy else e.samples_per_prompt, config.seed, 0.0 if e.greedy else None)
    sampling = dataclasses.replace(sampling, max_tokens=max_tokens or engine.max_tokens)
    start = time.perf_counter()
    if fleet.envs.live is not None:
        context = {"step": step, "policy_version": state.versions.served, "eval": True}
        trajectories = fleet.envs.rollouts([row_of(p) for p in problems], sampling.n, sampling, context)
        episodes = trajectory_ends(episodes_of(trajectories, problems, None))  # one per trajectory
    else:
        texts, ids = state.prompts.render_all(problems)
        generation = fleet.generate(ids, sampling)
        episodes = make_episodes(problems, texts, generation.completions, generation.policy_version, None)
    seconds = time.perf_counter() - start
    for part, scores in fleet.score(reward_batch(episodes, step)):
        apply_scores(episodes[part], scores)
    scored = [x for x in episodes if x.scored]  # a failed or unscorable sample has no reward to average
    members = sorted({name for x in scored for name in x.rewards})
    correct = [float(task.verify(x.completion, x.target)) for x in episodes]
    result = {
        "policy_version": min(x.policy_version for x in episodes),
        "heldout_accuracy": sum(correct) / len(episodes),
        "heldout_se": standard_error(per_prompt(episodes, correct)),
        "eval_problems": len(problems),
        "eval_reward": _mean([x.reward for x in scored]),
        **{f"eval_reward/{m}": _mean([x.rewards[m] for x in scored if m in x.rewards]) for m in members},
        "eval_failed": sum(x.reward_error is not None for x in episodes),
        "truncated": sum(x.finish_reason == "length" for x in episodes) / len(episodes),
        "eval_samples": len(episodes),
        "eval_greedy": float(e.greedy),
        "eval_s": seconds,
    }
    state.metrics.emit("eval", step=step, **result)
    return result


def per_prompt(episodes: list[Episode], values: list[float]) -> list[float]:
    """The mean of `values` (one per episode) over each prompt's episodes, in first-seen order."""
    by_prompt: dict[str, list[float]] = {}
    for episode, value in zip(episodes, values, strict=True):
        by_prompt.setdefault(episode.prompt_id, []).append(value)
    return [sum(v) / len(v) for v in by_prompt.values()]


def standard_error(values: list[float]) -> float:
    """The standard error of the mean of `values` (sample std / sqrt(n)); NaN for fewer than two."""
    n = len(values)
    if n < 2:
        return math.nan
    mean = sum(values) / n
    return math.sqrt(sum((v - mean) ** 2 for v in values) / (n - 1) / n)


def probe_samples(fleet: Fleet, state: RunState, n: int) -> list[Episode]:
    """`n` fresh samples of held-out prompts (groups of 4), scored by the task's verifier, with
    group-relative advantages: what a candidate reward or loss is validated on before the first
    rollout (the next rollout's seed; nothing is counted or stored)."""
    task, prompts, sampling = state.task, state.prompts, state.sampling(n=4)
    group = sampling.n
    problems = task.eval_set()[: -(-n // group)]
    texts, ids = prompts.render_all(problems)
    generation = fleet.generate(ids, sampling)
    episodes = make_episodes(problems, texts, generation.completions, generation.policy_version, None)
    rewards = torch.tensor([task.verify(x.completion, x.target) for x in episodes])
    advantages = group_relative(rewards.view(len(problems), group)).flatten().tolist()
    for x, r, a in zip(episodes, rewards.tolist(), advantages):
        x.reward, x.advantage = r, a
    return episodes[:n]


def probe_agents(fleet: Fleet, state: RunState, agent: AgentCode) -> list[Trajectory]:
    """Trajectories of candidate rollout `agent` on the first held-out rows (2 samples each): what it is
    checked on before it gets a version (never trained on, never stored)."""
    problems = state.task.eval_set()[:PROBE_ROWS]
    context = {"step": state.step_count, "policy_version": state.versions.served, "probe": True}
    return fleet.envs.rollouts([row_of(p) for p in problems], 2, state.sampling(n=2), context, agent)


def generate(
    fleet: Fleet, prompts: PromptFormat, prompt: str | list[dict], sampling: SamplingParams, max_tokens: int | None
) -> list[str]:
    """`sampling.n` completions of one prompt (a string or chat messages, in the task's prompt format)
    from the weights served now: nothing is scored, stored or trained on."""
    _, ids = prompts.encode(prompt)
    sampling = dataclasses.replace(sampling, max_tokens=max_tokens or sampling.max_tokens)
    return [c.text for c in fleet.generate([ids], sampling).completions[0]]


def _mean(values: list[float]) -> float:
    return sum(values) / len(values) if values else math.nan
