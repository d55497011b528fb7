"""What the trainer trains and ships, as `status()["trainer"]` and the dashboard's line show it."""

from types import SimpleNamespace

from forge_nb.actors.base import ActorInfo
from forge_nb.notebook.dashboard import Dashboard
from forge_nb.status import sizes_line, trainer_sizes
from tests.notebook.stand_in import dashboard_session

LORA = {"lora": True, "trainable_params": 4_884_480, "total_params": 139_399_488, "adapter_bytes": 19_537_920}


def _actors(details: dict) -> SimpleNamespace:
    return SimpleNamespace(info={"trainer": [ActorInfo("trainer", 1, "here", 1.0, {"device": "cpu", **details})]})


def test_trainer_sizes_come_from_the_trainers_answer_and_are_empty_when_down():
    actors = _actors({**LORA, "refresh_bytes": 19_537_984, "loaded": "whole: a quantization config"})
    assert trainer_sizes(actors) == {**LORA, "refresh_bytes": 19_537_984, "loaded": "whole: a quantization config"}
    assert trainer_sizes(None) == {} and sizes_line({}) == ""


def test_the_line_says_lora_params_adapter_and_refresh_bytes():
    assert sizes_line({**LORA, "refresh_bytes": 19_537_984}) == (
        "LoRA: 4.88M of 139M params trained (3.5%), adapter 19.5 MB, refresh 19.5 MB"
    )
    full = {"lora": False, "trainable_params": 134_515_008, "total_params": 134_515_008, "adapter_bytes": 0}
    assert (
        sizes_line({**full, "refresh_bytes": 538_060_096}) == "full: 135M of 135M params trained (100%), refresh 538 MB"
    )


def test_the_dashboard_shows_the_line():
    session = dashboard_session(actors=_actors({**LORA, "refresh_bytes": 19_537_984}))
    board = Dashboard(session)
    try:
        board.redraw()
        assert "LoRA: 4.88M of 139M params trained (3.5%)" in board.versions.value
    finally:
        board.close()
