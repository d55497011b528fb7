"""Experiment tracking on a real mesh: TensorBoard's own reader, W&B offline and an MLflow file store find
the scalars per step, the samples and the live reward's source at each version; a failing tracker is
dropped without stopping the run."""

import json

import pytest

from forge_nb.run.tracking import Trackers
from forge_nb.session import Session
from tests.conftest import wait_no_children

pytestmark = pytest.mark.slow


SHORT = "def short(prompt, completion, target, **context):\n    return float(len(completion) < 4)\n"  # as a cell


@pytest.fixture(scope="module")
def tracked():
    """A session with all three trackers, 3 steps, a new reward version, 2 more steps; then down."""
    s = Session.up(
        prompts_per_step=4,
        group_size=4,
        threads_per_proc=1,
        log={"tensorboard": True, "wandb": True, "mlflow": True},
    )
    try:
        s.step(3, progress=False)
        s.set_reward(SHORT, name="short", weight=0.5)
        s.step(2, progress=False)
        steps = s.metrics_stream.to_pandas("step").set_index("step")
        assert s.status()["log_errors"] == []
    finally:
        s.down()
    assert wait_no_children() == []
    return s.run_dir, steps


def test_tensorboard_reader_finds_scalars_samples_and_sources(tracked):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    run_dir, steps = tracked
    events = EventAccumulator(str(run_dir / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    events.Reload()
    scalars = events.Tags()["scalars"]
    assert {"step/mean_reward", "step/tokens_per_s", "train/loss", "train/grad_norm", "sync/gbps"} <= set(scalars)
    reward = events.Scalars("step/mean_reward")
    assert [e.step for e in reward] == list(steps.index)
    assert [round(e.value, 5) for e in reward] == [round(v, 5) for v in steps.mean_reward]
    texts = set(events.Tags()["tensors"])  # add_text lands as tensors
    assert {"samples/text_summary", "live/reward_v1/text_summary"} <= texts
    source = events.Tensors("live/reward_v1/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "def short(" in source and "weight 0.5" in source


def test_mlflow_file_store_has_metrics_tables_and_sources(tracked):
    from mlflow import MlflowClient

    run_dir, steps = tracked
    client = MlflowClient(tracking_uri=(run_dir / "mlruns").as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("forge_nb").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["algorithm.group_size"] == "4"
    history = client.get_metric_history(run.info.run_id, "step.mean_reward")
    assert sorted(m.step for m in history) == list(steps.index)
    artifacts = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"samples", "live"} <= artifacts
    assert (
        "def short("
        in (run_dir / "mlruns")
        .joinpath(run.info.experiment_id, run.info.run_id)
        .joinpath("artifacts", "live", "reward_v1.py")
        .read_text()
    )


def test_wandb_offline_run_has_history_tables_and_sources(tracked):
    run_dir, steps = tracked
    (offline,) = (run_dir / "wandb").glob("offline-run-*")
    (records,) = offline.glob("run-*.wandb")  # what `wandb sync` uploads: history rows as protobuf records
    assert records.read_bytes().count(b"step/mean_reward") >= len(steps)
    tables = sorted(offline.glob("files/media/table/samples_*.table.json"))
    assert len(tables) == len(steps)
    assert {"prompt", "completion", "reward"} <= set(json.loads(tables[0].read_text())["columns"])
    (source,) = offline.glob("files/media/html/live/reward_v1_*.html")
    assert "def short(" in source.read_text()


def test_a_tracker_that_raises_is_dropped_and_named():
    class Broken:
        def scalars(self, step, values):
            raise OSError("disk full")

    class Kept:
        seen: list = []

        def scalars(self, step, values):
            self.seen.append((step, values))

    trackers = Trackers([Broken(), Kept()])
    trackers.on_row({"kind": "step", "step": 1, "mean_reward": 0.5, "ok": True, "nan": float("nan")})
    trackers.on_row({"kind": "step", "step": 2, "mean_reward": 0.7})
    assert [type(t).__name__ for t in trackers.trackers] == ["Kept"]
    assert trackers.errors == ["Broken: OSError: disk full (it logs nothing more)"]
    assert Kept.seen == [(1, {"step/mean_reward": 0.5}), (2, {"step/mean_reward": 0.7})]
