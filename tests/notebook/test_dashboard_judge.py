"""The dashboard draws the judge's throughput and latency from the metrics stream's "judge" rows, and lays
itself out again when a panel gets its first data."""

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


def test_a_panel_appears_when_its_first_row_arrives_and_clicks_still_open_steps():
    from tests.notebook.test_panels import step

    session = dashboard_session()
    session.metrics_stream.emit(**step(1))
    board = Dashboard(session)
    try:
        assert "held-out accuracy" not in [a.text for a in board.figure.layout.annotations]
        board.figure.update_layout(width=900)  # as the width probe sets it
        session.metrics_stream.emit(**step(2))
        session.metrics_stream.emit("eval", step=0, heldout_accuracy=0.2, eval_greedy=1.0)
        board.redraw()
        assert "held-out accuracy" not in [a.text for a in board.figure.layout.annotations]  # a point, not a curve
        session.metrics_stream.emit("eval", step=2, heldout_accuracy=0.3, eval_greedy=1.0)
        board.redraw()
        assert "held-out accuracy" in [a.text for a in board.figure.layout.annotations]
        traces = {t.meta: t for t in board.figure.data}
        assert list(traces["heldout_greedy"].y) == [0.2, 0.3] and list(traces["mean_reward"].x) == [1, 2]
        assert board.figure.layout.width == 900
        assert traces["mean_reward"]._click_callbacks  # noqa: SLF001 (the explorer listens to the new trace)
    finally:
        board.close()


def test_a_step_without_a_value_is_a_gap_not_a_nan_the_browser_refuses():
    from tests.notebook.test_panels import step

    session = dashboard_session()
    session.metrics_stream.emit(**step(1))
    session.metrics_stream.emit(**step(2, entropy=float("nan")))
    board = Dashboard(session)
    try:
        traces = {t.meta: t for t in board.figure.data}
        assert list(traces["entropy"].y) == [1.2, None] and traces["entropy ema"].y[1] is None
    finally:
        board.close()


def test_a_session_going_down_closes_its_dashboard_once_and_draws_its_last_rows():
    """At `%forge down` the ticker sees the session down and closes the dashboard; `detach` then closes the
    session's views again, which must not raise (it did: the metrics stream's unsubscribe ran twice)."""
    import time

    from tests.notebook.test_panels import step

    session = dashboard_session()
    board = Dashboard(session, max_hz=50)
    session.metrics_stream.emit(**step(1))
    session.is_up = False
    deadline = time.monotonic() + 5
    while "session down" not in board.versions.value and time.monotonic() < deadline:  # the ticker's last redraw
        time.sleep(0.01)
    assert board._closed.is_set() and "session down" in board.versions.value  # noqa: SLF001
    board.close()  # as detach does
    assert list({t.meta: t for t in board.figure.data}["mean_reward"].x) == [1]
