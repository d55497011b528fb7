"""Trajectories as episodes: one per segment, ids in order, a group's id its first episode's, and the earlier
segments sharing their trajectory's scores once the last one is scored."""

from forge_nb.agents.episodes import episodes_of, share_with_segments, trajectory_ends
from forge_nb.agents.trajectory import Trajectory, Turn
from forge_nb.tasks.base import Problem


def trajectory(group: int, sample: int, segments: list[int]) -> Trajectory:
    turns = [Turn([1, 2], [3, 4], [-0.1, -0.2], f"t{i}", "stop", segment=s) for i, s in enumerate(segments)]
    return Trajectory(row={}, group=group, sample=sample, turns=turns, finish_reason="stop")


def test_one_episode_per_segment_with_the_trajectorys_scores():
    problems = [Problem("p0", "q0", "1"), Problem("p1", "q1", "2")]
    ts = [trajectory(0, 0, [0, 0]), trajectory(0, 1, [0, 1]), trajectory(1, 0, [0]), trajectory(1, 1, [0, 1, 1])]
    episodes = episodes_of(ts, problems, 10)
    assert [(e.sample_id, e.group_id, e.segment, e.segments) for e in episodes] == [
        (10, 10, 0, 1),
        (11, 10, 0, 2),
        (12, 10, 1, 2),
        (13, 13, 0, 1),
        (14, 13, 0, 2),
        (15, 13, 1, 2),
    ]
    assert episodes[0].completion_mask == [1, 1, 0, 0, 1, 1] and episodes[5].completion_ids == [3, 4, 1, 2, 3, 4]
    assert episodes[1].prompt_ids == [1, 2] and episodes[1].completion_mask == [1, 1]
    ends = trajectory_ends(episodes)
    assert [e.sample_id for e in ends] == [10, 12, 13, 15]  # one per trajectory, what the group statistics see
    for e, (reward, advantage) in zip(ends, [(1.0, 0.5), (0.0, -0.5), (1.0, 1.0), (2.0, -1.0)]):
        e.reward, e.advantage, e.rewards = reward, advantage, {"reward": reward}
    share_with_segments(episodes)
    assert [(e.reward, e.advantage) for e in episodes] == [
        (1.0, 0.5),
        (0.0, -0.5),
        (0.0, -0.5),
        (1.0, 1.0),
        (2.0, -1.0),
        (2.0, -1.0),
    ]
    assert episodes[1].row()["segment"] == "1/2" and "segment" not in episodes[0].row()
