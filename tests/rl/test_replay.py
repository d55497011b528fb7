import pytest

from forge_nb.rl.episode import Episode
from forge_nb.rl.replay import DuplicateSample, ReplayBuffer


def _episode(sample_id: int) -> Episode:
    return Episode(sample_id, sample_id, "p", "1+1=", "2", "2", [1], [5], [-0.1], "stop", 0)


def test_the_buffer_refuses_a_sample_it_already_holds_or_held():
    buffer = ReplayBuffer(capacity=2)
    buffer.add([_episode(0), _episode(1)])
    buffer.add([_episode(2)])  # pushes sample 0 out of the window
    for again in ([_episode(2)], [_episode(0)], [_episode(3), _episode(3)]):
        with pytest.raises(DuplicateSample):
            buffer.add(again)
    assert buffer.added == 3 and [e.sample_id for e in buffer.recent(5)] == [1, 2]
