"""Checkpoint files without a mesh: what is written reads back equal; periodic ones are listed and pruned."""

import math

from forge_nb.config import AlgorithmConfig, Config, TaskConfig
from forge_nb.live.builtin import builtin_loss, builtin_reward
from forge_nb.live.capture import LiveCode
from forge_nb.live.registry import Member, Registry
from forge_nb.rl.episode import Episode
from forge_nb.run import checkpoint_files as checkpoint
from forge_nb.tasks import make_task
from forge_nb.tasks.dataset import DatasetTask


def _registry() -> Registry:
    r = Registry()
    r.add_builtin("reward", "reward", builtin_reward(TaskConfig()))
    r.add_builtin("loss", "loss", builtin_loss(AlgorithmConfig(), max_tokens=6))
    code = LiveCode(
        "reward", "fmt", "def fmt(p, c, t):\n    return 1.0\n", "cell, line 1", paths=("/x",), reload=("m",)
    )
    r.accept("reward", "fmt", r.propose("reward", "fmt", code, 0.2), {"seconds": 0.01})
    r.reject("loss", "loss", LiveCode("loss", "", "bad", "cell"), {"error": "no"})
    return r


def test_a_checkpoint_reads_back_what_was_written(tmp_path):
    episode = Episode(
        7,
        4,
        "1+1",
        "1+1=",
        "2",
        "2",
        [1, 5],
        [6, 2],
        [-0.1, -0.2],
        "stop",
        3,
        reward=math.nan,
        rewards={"reward": 1.0},
        reward_error="boom",
        extras={"level": "easy"},
    )
    registry = _registry()
    written = checkpoint.write(
        tmp_path / "ck",
        {"step_count": 5, "task": {"rng": [3, [1, 2], None]}},
        Config().to_dict(),
        {"train": [{"q": "a"}], "eval": [{"q": "b"}]},
        registry.to_records(),
        [episode],
        [0, 7],
        [{"kind": "step"}],
        lambda folder: (folder / "trainer").mkdir(),
    )
    back = checkpoint.read(written)
    assert back.step == 5 and back.state["task"] == {"rng": [3, [1, 2], None]}
    assert Config.from_dict(back.config) == Config() and back.data == {"train": [{"q": "a"}], "eval": [{"q": "b"}]}
    assert back.sample_ids == [0, 7] and back.metrics == [{"kind": "step"}] and back.generator_dir == back.trainer_dir
    (read,) = back.episodes
    assert math.isnan(read.reward) and {**read.__dict__, "reward": 0} == {**episode.__dict__, "reward": 0}
    restored = Registry.from_records(back.live)
    assert restored.to_pandas().drop(columns="created").equals(registry.to_pandas().drop(columns="created"))
    assert restored.members("reward")["fmt"] == Member(registry.members("reward")["fmt"].code, 0.2)
    assert restored.live("reward").version == 1 and restored.next_version("loss") == 1


def test_writing_again_replaces_and_periodic_ones_are_pruned(tmp_path):
    for step in (2, 4, 6, 8):
        checkpoint.write(
            tmp_path / checkpoint.PERIODIC.format(step=step),
            {"step_count": step},
            {},
            None,
            {"records": [], "live": {}},
            [],
            [],
            [],
            lambda folder: None,
        )
    checkpoint.prune(tmp_path, keep=2)
    assert [s for s, _ in checkpoint.periodic(tmp_path)] == [6, 8]
    checkpoint.write(
        tmp_path / "step-00000008",
        {"step_count": 9},
        {},
        None,
        {"records": [], "live": {}},
        [],
        [],
        [],
        lambda folder: None,
    )
    assert checkpoint.read(tmp_path / "step-00000008").step == 9 and not list(tmp_path.glob(".*"))


def test_task_streams_go_on_from_their_saved_state():
    task = make_task(TaskConfig(), seed=3)
    task.sample(5)
    state, expected = task.state(), [p.prompt for p in task.sample(4)]
    again = make_task(TaskConfig(), seed=3)
    again.load_state(state)
    assert [p.prompt for p in again.sample(4)] == expected
    rows = [{"prompt": f"{i}+1=", "answer": str(i + 1)} for i in range(10)]
    data = DatasetTask.load(rows, TaskConfig(name="dataset"), seed=1)
    data.sample(13)
    state, expected = data.state(), [p.prompt_id for p in data.sample(9)]
    other = DatasetTask.load(rows, TaskConfig(name="dataset"), seed=1)
    other.load_state(state)
    assert [p.prompt_id for p in other.sample(9)] == expected and other.epoch == data.epoch
