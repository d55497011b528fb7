"""Static plots of a session's step rows (matplotlib): what a saved notebook shows where a live widget
cannot render (GitHub, nbviewer, a notebook opened without its kernel).

`step_figure(steps)` draws the dashboard's step panels from the `StepRow` table (`s.step(...)`, or
``s.metrics_stream.to_pandas("step")``); `png(fig)` turns a figure into PNG bytes for a display bundle.
matplotlib is optional (the ``notebooks`` extra): without it `available()` is False and nothing is drawn.
"""

from __future__ import annotations

import io
import textwrap
from typing import Any

import pandas as pd

from forge_nb.notebook.panels import PHASES, Panel, eval_row, shown

# Drawn faint, with their moving average.
SMOOTHED = ("mean_reward", "accuracy", "tokens_per_s", "entropy", "response_length")
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


def step_figure(
    steps: pd.DataFrame, title: str = "", judge: pd.DataFrame | None = None, evals: pd.DataFrame | None = None
) -> Any:
    """The live dashboard's panels (`panels.shown`: those with data, the same titles and units) as one
    matplotlib figure, two per row, each against the step. `steps` has one row per step (a "step" column or
    index: `s.step(...)` or ``s.metrics_stream.to_pandas("step")``); `judge` and `evals` are the stream's
    "judge" and "eval" rows, if any."""
    from matplotlib.figure import Figure

    if evals is not None and not evals.empty:
        evals = pd.DataFrame([eval_row(r) for r in evals.to_dict("records")])
    frames = {"step": steps.reset_index() if "step" not in steps.columns else steps, "judge": judge, "eval": evals}
    frames = {k: v for k, v in frames.items() if v is not None and not v.empty}
    panels = shown({k: v.to_dict("records") for k, v in frames.items()})
    rows = max(1, -(-len(panels) // 2))
    fig = Figure(figsize=(10, 2.8 * rows), layout="constrained")
    axes = fig.subplots(rows, 2, squeeze=False).ravel()
    for ax, panel in zip(axes, panels, strict=False):
        _panel(ax, panel, frames[panel.kind])
    for ax in axes[len(panels) :]:
        ax.set_axis_off()
    if title:  # the dashboard's header: wrapped to the figure's width
        lines = [textwrap.fill(line, 120) for line in title.splitlines()]
        fig.suptitle("\n".join(lines), fontsize="medium")
    return fig


def _panel(ax, panel: Panel, df: pd.DataFrame) -> None:
    """One panel: a stack of the phases, or each series (faint with its moving average where smoothed)."""
    if panel.series[0] in PHASES:
        ax.stackplot(df.step, *(df[p] for p in panel.series), labels=[p.removesuffix("_s") for p in panel.series])
    else:
        for name in panel.series:
            style = ":" if name in ("accuracy", "response_length_max", "tool_errors") else "-"
            label = name.replace("_", " ")
            if name in SMOOTHED:
                _curve(ax, df.step, df[name], label, style)
            else:
                ax.plot(df.step, df[name], style, marker="o" if name.startswith("heldout") else None, label=label)
    if "mean_reward" not in panel.series:  # counts, times, shares: from 0 (a reward may be negative)
        ax.set_ylim(0, max(ax.get_ylim()[1], 1e-3) * 1.05)  # headroom: a flat line is not drawn on the frame
    ax.set_title(panel.title)
    ax.set_ylabel(panel.unit)
    ax.set_xlabel("step")
    ax.xaxis.get_major_locator().set_params(integer=True)
    ax.grid(alpha=0.3)
    if len(panel.series) > 1 or panel.series[0] in SMOOTHED:  # under the plot: inside, it sat on the data
        ax.legend(loc="upper left", bbox_to_anchor=(0.0, -0.22), ncols=3, fontsize="small", frameon=False)


def png(fig: Any, dpi: int = 80) -> bytes:
    """`fig` as PNG bytes."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=dpi)
    return buffer.getvalue()
