"""The dashboard draws the judge's throughput and latency from the metrics stream's "judge" rows."""

from types import SimpleNamespace

from forge_nb.metrics import MetricsStream
from forge_nb.notebook.dashboard import Dashboard


def _session():
    live = SimpleNamespace(version=1)
    return SimpleNamespace(
        metrics_stream=MetricsStream(),
        is_up=True,
        background=None,
        trainer_version=2,
        generator_version=2,
        step_count=2,
        registry=SimpleNamespace(live=lambda kind: live, records=[]),
    )


def test_judge_rows_feed_the_judge_plots_and_step_rows_the_others():
    session = _session()
    session.metrics_stream.emit("judge", step=0, verdicts_per_s=4.0, latency_s=3.5)
    board = Dashboard(session)
    try:
        session.metrics_stream.emit("judge", step=1, verdicts_per_s=5.0, latency_s=3.0)
        board.redraw()
        traces = {t.meta: t for t in board.figure.data}
        assert list(traces["verdicts_per_s"].y) == [4.0, 5.0] and list(traces["latency_s"].x) == [0, 1]
        assert list(traces["mean_reward"].y) == []
    finally:
        board.close()
