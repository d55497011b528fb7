"""The dashboard's static picture (a saved notebook's fallback where widgets do not render)."""

import pandas as pd
import pytest

from forge_nb.notebook import plots


def test_step_rows_draw_to_a_png():
    steps = pd.DataFrame(
        {
            "step": [1, 2, 3],
            "mean_reward": [0.2, 0.4, 0.5],
            "accuracy": [0.2, 0.4, 0.5],
            "tokens_per_s": [900.0, 1100.0, 1000.0],
            "generate_s": [0.1, 0.1, 0.1],
            "train_s": [0.2, 0.2, 0.2],
            "refresh_gbps": [1.0, 1.2, 1.1],
        }
    )
    assert plots.available()
    png = plots.png(plots.step_figure(steps, title="run"))
    assert png.startswith(b"\x89PNG") and len(png) > 10_000


def test_the_picture_has_the_policys_entropy_and_response_lengths():
    steps = pd.DataFrame(
        {
            "step": [1, 2],
            "mean_reward": [0.2, 0.4],
            "accuracy": [0.1, 0.3],
            "tokens_per_s": [900.0, 1100.0],
            "train_s": [0.2, 0.2],
            "refresh_gbps": [1.0, 1.2],
            "entropy": [1.9, 1.7],
            "response_length": [11.5, 10.0],
            "response_length_max": [16, 16],
        }
    )
    fig = plots.step_figure(steps)
    titles = [ax.get_title() for ax in fig.axes]
    assert "policy entropy" in titles and "response length" in titles
    entropy = fig.axes[titles.index("policy entropy")]
    assert entropy.get_ylabel() == "nats per token"
    raw, smooth = entropy.lines[:2]
    assert list(raw.get_ydata()) == [1.9, 1.7]
    # The debiased moving average: the first step is its own value, the second 0.2 of the way to the new one.
    assert list(smooth.get_ydata()) == pytest.approx([1.9, (0.8 * 0.2 * 1.9 + 0.2 * 1.7) / (1 - 0.8**2)])


def test_the_picture_has_the_live_dashboards_panels():
    from forge_nb.notebook.dashboard import Dashboard
    from tests.notebook.stand_in import dashboard_session
    from tests.notebook.test_panels import step

    session = dashboard_session()
    for n in (1, 2):
        session.metrics_stream.emit(**step(n, accuracy=0.1 * n))
    session.metrics_stream.emit("judge", step=1, verdicts_per_s=4.0, latency_s=3.5)
    session.metrics_stream.emit("eval", step=0, heldout_accuracy=0.2, eval_greedy=1.0)
    session.metrics_stream.emit("eval", step=2, heldout_accuracy=0.3, eval_greedy=1.0)
    board = Dashboard(session)
    try:
        live = [a.text for a in board.figure.layout.annotations]
        stream = session.metrics_stream
        fig = plots.step_figure(
            stream.to_pandas("step"), judge=stream.to_pandas("judge"), evals=stream.to_pandas("eval")
        )
        assert [ax.get_title() for ax in fig.axes if ax.get_title()] == live
        assert "held-out accuracy" in live and "judge latency per call" in live and "refresh bandwidth" not in live
    finally:
        board.close()


def test_the_live_dashboards_moving_average_is_the_pictures():
    from forge_nb.notebook.dashboard import MovingAverage

    values = [0.2, float("nan"), 0.5, 0.1, 0.4]
    live = MovingAverage(plots.EMA).add(values)
    picture = plots.smoothed(pd.Series(values)).tolist()
    assert live[1] != live[1]  # NaN where the step has no value
    assert [live[i] for i in (0, 2, 3, 4)] == pytest.approx([picture[i] for i in (0, 2, 3, 4)])


def test_the_picture_is_titled_with_the_dashboards_header():
    from forge_nb.notebook.dashboard import Dashboard
    from tests.notebook.stand_in import dashboard_session
    from tests.notebook.test_panels import step

    session = dashboard_session()
    session.metrics_stream.emit(**step(1))
    board = Dashboard(session)
    try:
        caption = board.widget.caption()
        assert caption.startswith("policy v2 serving / v2 trained (staleness 0) · reward v1") and "<" not in caption
    finally:
        board.close()
