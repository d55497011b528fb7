"""Static plots of a session's step rows (matplotlib): what a saved notebook shows where a live widget
cannot render (GitHub, nbviewer, a notebook opened without its kernel).

`step_figure(steps)` draws the dashboard's step panels from the `StepRow` table (`s.step(...)`, or
``s.metrics_stream.to_pandas("step")``); `png(fig)` turns a figure into PNG bytes for a display bundle.
matplotlib is optional (the ``notebooks`` extra): without it `available()` is False and nothing is drawn.
"""

from __future__ import annotations

import io
from typing import Any

import pandas as pd

PHASES = ("generate_s", "score_s", "reference_s", "train_s", "refresh_s")  # stacked: their sum ~ step time
# The weight of the past in the smoothed curves: an exponential moving average over the steps, debiased as
# TensorBoard's smoothing is (the first steps are not pulled towards 0); each step's own value is drawn faint.
EMA = 0.8


def smoothed(values: pd.Series) -> pd.Series:
    """The debiased moving average of `values` (NaN skipped): pandas' adjusted ``ewm`` is that average."""
    return values.ewm(alpha=1 - EMA, adjust=True, ignore_na=True).mean()


def _curve(ax, x, y, label: str, style: str = "-", color: str | None = None) -> None:
    """`y` faint, its moving average solid, one legend entry."""
    line = ax.plot(x, y, style, alpha=0.3, color=color)[0]
    ax.plot(x, smoothed(y), style, color=line.get_color(), label=f"{label} (EMA {EMA})")


def available() -> bool:
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        return False
    return True


def step_figure(steps: pd.DataFrame, title: str = "") -> Any:
    """The dashboard's panels as one matplotlib figure: reward and accuracy, generated tokens/s, time
    per phase (stacked seconds), refresh GB/s, the policy's entropy and response lengths, each against the
    step. `steps` has one row per step (a "step" column or index)."""
    from matplotlib.figure import Figure

    df = steps.reset_index() if "step" not in steps.columns else steps
    fig = Figure(figsize=(10, 8.4), layout="constrained")
    (reward, tokens), (phases, refresh), (entropy, lengths) = fig.subplots(3, 2, sharex=True)
    _curve(reward, df.step, df.mean_reward, "mean_reward")
    _curve(reward, df.step, df.accuracy, "accuracy", ":")
    reward.set_title("reward and accuracy")
    reward.legend(loc="lower right", fontsize="small")
    tokens.plot(df.step, df.tokens_per_s, color="tab:green")
    tokens.set_title("generated tokens/s")
    present = [p for p in PHASES if p in df.columns]
    phases.stackplot(df.step, *(df[p] for p in present), labels=[p.removesuffix("_s") for p in present])
    phases.set_title("time per phase (s)")
    phases.legend(loc="upper left", fontsize="small", ncols=len(present))
    refresh.plot(df.step, df.refresh_gbps, color="tab:purple")
    refresh.set_title("refresh GB/s")
    if "entropy" in df.columns:  # step rows from before forge_nb logged them have none
        _curve(entropy, df.step, df.entropy, "entropy", color="tab:brown")
        _curve(lengths, df.step, df.response_length, "mean")
        lengths.plot(df.step, df.response_length_max, ":", label="max")
        lengths.legend(loc="lower right", fontsize="small")
    entropy.set_title("policy entropy (nats per token)")
    lengths.set_title("response length (policy tokens)")
    for ax in (entropy, lengths):
        ax.set_xlabel("step")
    for ax in (reward, tokens, phases, refresh, entropy, lengths):
        ax.grid(alpha=0.3)
    if title:
        fig.suptitle(title)
    return fig


def png(fig: Any, dpi: int = 80) -> bytes:
    """`fig` as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
