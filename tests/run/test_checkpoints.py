"""`forge_nb.run.checkpoints.Checkpoints`: the periodic schedule, and a periodic checkpoint the trainer died in."""

from pathlib import Path

from forge_nb.config import Config
from forge_nb.fleet.recovery import CheckpointLost
from forge_nb.run.checkpoints import Checkpoints


def test_a_periodic_checkpoint_the_trainer_died_in_is_an_event_and_the_run_goes_on(tmp_path):
    config = Config.from_dict({"checkpoint": {"every": 2, "dir": str(tmp_path)}})
    checkpoints, events = Checkpoints(config, tmp_path), []
    assert [s for s in range(1, 6) if checkpoints.due(s)] == [2, 4]

    def save(path: Path) -> Path:
        raise CheckpointLost("the trainer died while saving (Killed(sig=9)); nothing was saved")

    checkpoints.periodic(4, save, lambda role, what: events.append((role, what)))
    assert events == [
        (
            "checkpoint",
            "the checkpoint of step 4 was not written: the trainer died while saving "
            "(Killed(sig=9)); nothing was saved",
        )
    ]
