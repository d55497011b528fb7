"""Trajectories as `Episode`s: what the step scores, trains on and logs, one per trajectory.

The first prompt is the episode's prompt; everything after it (the model's replies, tool results,
environment messages, template glue) is its completion, with a mask that is 1 only on the policy's
own tokens, so the trainer's loss and its logprobs see nothing else.
"""

from __future__ import annotations

from collections.abc import Sequence

from forge_nb.agents.trajectory import Trajectory
from forge_nb.rl.episode import Episode
from forge_nb.tasks.base import Problem

FAILED = "agent rollout failed"


def row_of(problem: Problem) -> dict:
    """The row a rollout or an environment gets: the prompt (text or chat messages), the target
    under "target" and "answer", the prompt id and the dataset's other columns."""
    return {
        **problem.extras,
        "prompt": problem.prompt,
        "target": problem.target,
        "answer": problem.target,
        "prompt_id": problem.prompt_id,
    }


def episodes_of(
    trajectories: Sequence[Trajectory], problems: Sequence[Problem], first_sample_id: int | None
) -> list[Episode]:
    """One episode per segment of each trajectory (one per trajectory unless a call did not extend the
    conversation: `Trajectory.segments`), in the runner's order (row-major); sample ids from
    `first_sample_id` (None: probe episodes, id -1), the group id of a row's samples the id of its first."""
    episodes: list[Episode] = []
    group_start: dict[int, int] = {}
    for t in trajectories:
        segments = t.segments()
        for k, segment in enumerate(segments):
            sample_id = -1 if first_sample_id is None else first_sample_id + len(episodes)
            group_id = -1 if first_sample_id is None else group_start.setdefault(t.group, sample_id)
            episodes.append(_episode(segment, problems[t.group], sample_id, group_id))
            episodes[-1].segment, episodes[-1].segments = k, len(segments)
    return episodes


def _episode(t: Trajectory, problem: Problem, sample_id: int, group_id: int) -> Episode:
    versions = t.info.get("policy_versions") or [0]
    return Episode(
        sample_id=sample_id,
        group_id=group_id,
        prompt_id=problem.prompt_id,
        prompt=_text(problem.prompt),
        completion=t.turns[-1].text if t.turns else "",
        target=problem.target,
        prompt_ids=t.prompt_ids,
        completion_ids=t.completion_ids(),
        logprobs=t.completion_logprobs(),
        finish_reason=t.finish_reason or "error",
        policy_version=min(versions),
        extras=problem.extras,
        completion_mask=t.completion_mask(),
        turns=[_turn(turn) for turn in t.turns],
        reward_error=f"{FAILED}: {t.error}" if t.finish_reason == "error" else None,
    )


def trajectory_ends(episodes: Sequence[Episode]) -> list[Episode]:
    """Each trajectory's last segment: what the live rewards score and the advantages are computed on
    (the same list, in order, when no trajectory has several segments)."""
    return [e for e in episodes if e.segment == e.segments - 1]


def share_with_segments(episodes: list[Episode]) -> None:
    """Give every earlier segment its trajectory's reward, rewards, reward error and advantage (those of
    the last segment, which follows it in `episodes`)."""
    for i in range(len(episodes) - 1, -1, -1):
        e = episodes[i]
        if e.segment < e.segments - 1:
            end = episodes[i + e.segments - 1 - e.segment]
            e.reward, e.rewards, e.advantage = end.reward, dict(end.rewards), end.advantage
            e.reward_error, e.reward_version = end.reward_error, end.reward_version


def own_reward(t: Trajectory) -> float | None:
    """The reward a trajectory carries itself (its rollout's return value plus per-turn rewards), or None
    when it has none and the live rewards decide."""
    if t.reward is None and not any(t.turn_rewards):
        return None
    return t.total_reward


def _turn(turn) -> dict:
    return {
        "text": turn.text,
        "prompt_tokens": len(turn.prompt_delta_ids),
        "completion_tokens": len(turn.completion_ids),
        "finish_reason": turn.finish_reason,
        "reward": turn.reward,
        "tool_calls": turn.tool_calls,
        "tool_errors": turn.tool_errors,
        "segment": turn.segment,
        "new_segment": turn.new_segment,
    }


def _text(prompt: str | list[dict]) -> str:
    return prompt if isinstance(prompt, str) else "\n".join(f"{m['role']}: {m['content']}" for m in prompt)
