"""The dashboard draws the judge's throughput and latency from the metrics stream's "judge" rows."""

from forge_nb.notebook.dashboard import Dashboard
from tests.notebook.stand_in import dashboard_session


def test_judge_rows_feed_the_judge_plots_and_step_rows_the_others():
    session = dashboard_session()
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
