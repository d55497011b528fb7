"""Live dashboard: ipywidgets + one plotly FigureWidget fed by the session's metrics stream.

Rows arrive from any thread (a background run emits them); they are queued and drawn by a timer
at most `max_hz` times per second in one `batch_update`, never one redraw per point.

Displayed, the dashboard also carries a PNG of its curves so far (`notebook.plots`, with matplotlib):
JupyterLab renders the live widget, and a saved notebook on GitHub or nbviewer, where widgets do not
render, shows the picture.
"""

from __future__ import annotations

import html
import math
import re
import threading
from typing import Any

import ipywidgets as widgets
import plotly.colors
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from forge_nb.notebook import plots
from forge_nb.notebook.explorer import Explorer
from forge_nb.notebook.fit_width import fit_width
from forge_nb.notebook.panels import PANELS, PHASES, Panel, eval_row, shown
from forge_nb.notebook.plots import EMA, SMOOTHED
from forge_nb.status import sizes_line, trainer_sizes

JUDGE = ("verdicts_per_s", "latency_s")  # from "judge" rows: the judge's own throughput, and wait per call
KINDS = ("step", "judge", "eval")  # the metrics stream's rows it draws
# `plots.SMOOTHED` columns are drawn twice: each step's value, faint, and their moving average, solid.
SMOOTH = " ema"  # a smoothed trace's meta: its column's name and this


class Dashboard:
    """Reward / accuracy, held-out accuracy, tokens/s, time per phase, refresh GB/s, judge verdicts/s and
    latency, an agent's turns per trajectory and tool calls / errors, the policy's entropy, response lengths,
    clip fraction and KL to the reference -- each panel once the run has data for it (`panels.shown`); versions
    and staleness; buttons; below, the sample explorer, opened on a step by clicking a point of the reward
    curve."""

    def __init__(self, session, max_hz: float = 4.0) -> None:
        self.session = session
        self._rows: dict[str, list[dict[str, Any]]] = {kind: [] for kind in KINDS}
        self._panels = shown(self._rows)
        self.figure = go.FigureWidget(_figure(self._panels))
        self.versions = widgets.HTML()
        self.run_button = widgets.Button(description="Run", icon="play", tooltip="start / pause the background run")
        self.step_button = widgets.Button(description="Step", icon="forward")
        self.sync_button = widgets.Button(description="Sync weights", icon="refresh")
        self.message = widgets.HTML()
        self.run_button.on_click(lambda _: self._guard(self._toggle_run))
        self.step_button.on_click(lambda _: self._guard(lambda: session.step(1)))
        self.sync_button.on_click(lambda _: self._guard(session.sync))
        buttons = widgets.HBox([self.run_button, self.step_button, self.sync_button])
        self.explorer = Explorer(session, figure=self.figure, on_show=self._open_samples)
        self.samples = widgets.Accordion([self.explorer.widget], titles=["Samples: click a point of the reward curve"])
        self.samples.selected_index = None
        self.widget = fit_width(
            DashboardBox(
                [widgets.HBox([buttons, self.versions]), self.message, self.figure, self.samples],
                layout={"width": "100%"},
            ),
            [self.figure],
        )
        self.widget.session = session
        self.widget.caption = lambda: _plain(self._versions_html())  # the picture's title: what the header says
        self.widget.add_class("forge-dashboard")
        self._pending: list[dict[str, Any]] = []
        self._averages = {name: MovingAverage(EMA) for name in SMOOTHED}
        self._lock = threading.Lock()
        self._period = 1.0 / max_hz
        self._closed = threading.Event()
        for row in session.metrics_stream.rows():
            self._on_row(row)
        self._unsubscribe = session.metrics_stream.subscribe(self._on_row)
        self.redraw()
        threading.Thread(target=self._ticker, name="forge_nb-dashboard", daemon=True).start()

    def _open_samples(self, step: int) -> None:
        self.samples.set_title(0, f"Samples of step {step}")
        self.samples.selected_index = 0

    def _on_row(self, row: dict[str, Any]) -> None:
        if row["kind"] in KINDS:
            with self._lock:
                self._pending.append(eval_row(row) if row["kind"] == "eval" else row)

    def _ticker(self) -> None:
        while not self._closed.wait(self._period):
            if not self.session.is_up:  # down: the last rows, "session down", and no more calls to it
                self.close()
                self.redraw(up=False)
                return
            self.redraw()

    def redraw(self, up: bool = True) -> None:
        """Draw queued rows (one batch update; the whole figure again when a panel or series appears) and
        refresh the version line (`up` False: the session is down, nothing is asked of it)."""
        with self._lock:
            rows, self._pending = self._pending, []
        for row in rows:
            self._rows[row["kind"]].append(row)
        panels = shown(self._rows) if rows else self._panels  # only new rows can bring a panel or series
        if panels != self._panels:
            self._rebuild(panels)
        elif rows:
            self._draw(rows)
        self.versions.value = self._versions_html() if up else "<b>session down</b>"
        self.run_button.description = "Pause" if up and self._run_state() == "running" else "Run"

    def _rebuild(self, panels: list[Panel]) -> None:
        """Lay the figure out again for `panels` and draw every row so far into it (same widget: the
        explorer's clicks are hooked to its new traces)."""
        self._panels = panels
        new, width = _figure(panels), self.figure.layout.width
        self.figure.data = ()
        self.figure.layout = new.layout
        self.figure.update_layout(width=width)
        self.figure.add_traces(list(new.data))
        self._averages = {name: MovingAverage(EMA) for name in SMOOTHED}
        self._draw([r for kind in KINDS for r in self._rows[kind]])
        self.explorer.listen(self.figure)

    def _draw(self, rows: list[dict[str, Any]]) -> None:
        """Append `rows` to the traces of their columns."""
        with self.figure.batch_update():
            for trace in self.figure.data:
                column = trace.meta.removesuffix(SMOOTH)
                mine = [r for r in rows if r["kind"] == KIND.get(column, "step")]
                values = [r.get(column, math.nan) for r in mine]  # rows from older runs lack new columns
                if trace.meta.endswith(SMOOTH):
                    values = self._averages[column].add(values)
                trace.x = (*trace.x, *(r["step"] for r in mine))
                trace.y = (*trace.y, *map(_gap, values))
            # Whole steps only, about ten ticks (plotly would otherwise label 1.5 as "2" next to 2).
            self.figure.update_xaxes(dtick=max(1, math.ceil(len(self._rows["step"]) / 10)))

    def _versions_html(self) -> str:
        s = self.session
        if not s.is_up:
            return "<b>session down</b>"
        trainer, generator = s.trainer_version, s.generator_version
        run = s.background
        state = self._run_state() or "idle"
        error = f" <span style='color:#b00'>{run.error.splitlines()[0]}</span>" if run and run.error else ""
        events = s.metrics_stream.rows("event")
        if events:  # the latest supervision event: a proc respawned or replaced, a trainer restored
            e = events[-1]
            error += (
                f" <span class='forge-event' style='color:#a60'>&middot; {e['role']}: {html.escape(e['what'])}</span>"
            )
        return (
            f"<span class='forge-versions'>policy <b class='forge-policy-generator'>v{generator}</b> serving"
            f" / v{trainer} trained (staleness {trainer - generator})"
            f" &middot; reward v{s.registry.live('reward').version}"
            f" &middot; loss v{s.registry.live('loss').version}{_rollout_version(s)}"
            f" &middot; step {s.step_count} &middot; {state}{error}</span>"
            f"<br><span class='forge-sizes'>{html.escape(sizes_line(trainer_sizes(getattr(s, 'actors', None))))}</span>"
        )

    def _run_state(self) -> str | None:
        run = self.session.background
        return None if run is None else run.state

    def _toggle_run(self) -> None:
        state = self._run_state()
        if state == "running":
            self.session.pause()
        elif state == "paused":
            self.session.resume()
        else:
            self.session.run()

    def _guard(self, action) -> None:
        """Run a button's action; show its error in the dashboard instead of losing it."""
        try:
            action()
            self.message.value = ""
        except Exception as e:
            self.message.value = f"<span style='color:#b00'>{type(e).__name__}: {e}</span>"
        self.redraw()

    def close(self) -> None:
        """Stop drawing (safe twice: the ticker closes a dashboard whose session went down, and `detach` closes the
        session's views again)."""
        with self._lock:
            if self._closed.is_set():
                return
            self._closed.set()
        self._unsubscribe()


class DashboardBox(widgets.VBox):
    """The dashboard's widget; its display bundle adds a PNG of the step curves so far (a fallback
    for viewers without widgets: the richest type a viewer knows wins, the widget in JupyterLab)."""

    session = None
    caption = None  # -> the header's text (versions, state, sizes), the picture's title

    def _repr_mimebundle_(self, **kwargs):
        bundle = super()._repr_mimebundle_(**kwargs)
        stream = self.session.metrics_stream if self.session is not None else None
        steps = stream.to_pandas("step") if stream is not None else None
        if bundle is not None and steps is not None and not steps.empty and plots.available():
            title = self.caption() if self.caption is not None else ""
            figure = plots.step_figure(steps, title, judge=stream.to_pandas("judge"), evals=stream.to_pandas("eval"))
            bundle["image/png"] = plots.png(figure)
        return bundle


COLORS = plotly.colors.qualitative.Plotly  # a panel's n-th series; its moving average has the same color
LEGEND_BELOW_PX = 22  # a legend's top this far under its plot (below the tick labels); every x axis is the step
KIND = {name: panel.kind for panel in PANELS for name in panel.series}  # which rows carry a column


def _figure(panels: list[Panel]) -> go.Figure:
    """`panels` in two columns against the step, each with its unit on the y axis and its own legend in a row under
    its x axis (a legend inside the plot sat on the data)."""
    rows = max(1, math.ceil(len(panels) / 2))
    height = 80 + 290 * rows  # px; each row: a plot, its legend under it, the next row's title
    fig = make_subplots(
        rows=rows,
        cols=2,
        horizontal_spacing=0.08,
        vertical_spacing=min(90 / height, 0.3),
        subplot_titles=[p.title for p in panels],
    )
    legends = {}
    for i, panel in enumerate(panels):
        row, col = i // 2 + 1, i % 2 + 1
        legend = "legend" if i == 0 else f"legend{i + 1}"
        axis = fig.get_subplot(row, col)
        legends[legend] = {
            "x": axis.xaxis.domain[0],
            "y": axis.yaxis.domain[0] - LEGEND_BELOW_PX / height,  # under the tick labels
            "xanchor": "left",
            "yanchor": "top",
            "orientation": "h",
            "bgcolor": "rgba(0, 0, 0, 0)",
            "font": {"size": 11},
        }
        for name, color in zip(panel.series, COLORS, strict=False):
            for trace in _traces(name, legend, color):
                fig.add_trace(trace, row, col)
        zero = "normal" if panel.kind == "step" and "mean_reward" in panel.series else "tozero"  # rewards may be < 0
        fig.update_yaxes(title_text=panel.unit, title_font={"size": 11}, rangemode=zero, row=row, col=col)
    # No fixed width: the figure takes the cell's width (JupyterLab's output area), with its legends.
    fig.update_layout(height=height, autosize=True, margin={"l": 60, "r": 20, "t": 40, "b": 50}, **legends)
    fig.update_xaxes(tickformat="d")
    return fig


def _traces(name: str, legend: str, color: str) -> list[go.Scatter]:
    """Column `name`'s traces in a plot, in `color`: its values, and for a `SMOOTHED` column its moving
    average too."""
    kwargs: dict[str, Any] = {"stackgroup": "phases"} if name in PHASES else {}
    label = name.removesuffix("_s") if name in PHASES else name.replace("_", " ")
    label = f"judge {label}" if name in JUDGE else label
    line: dict[str, Any] = {"color": color, **({"dash": "dot"} if name == "accuracy" else {})}
    mode = "lines+markers" if name == "mean_reward" or name.startswith("heldout") else "lines"  # reward: opens a step
    if name not in SMOOTHED:
        return [go.Scatter(x=[], y=[], name=label, meta=name, mode=mode, legend=legend, line=line, **kwargs)]
    group = {"legend": legend, "legendgroup": name}
    raw = go.Scatter(x=[], y=[], name=label, meta=name, mode=mode, opacity=0.35, line=line, showlegend=False, **group)
    smooth = go.Scatter(x=[], y=[], name=f"{label} (EMA {EMA})", meta=name + SMOOTH, mode="lines", line=line, **group)
    return [raw, smooth]


class MovingAverage:
    """An exponential moving average, debiased (as TensorBoard's smoothing): NaN values are skipped."""

    def __init__(self, weight: float) -> None:
        self.weight, self.total, self.count = weight, 0.0, 0

    def add(self, values: list[float]) -> list[float]:
        """The average after each of `values` (NaN where the value is)."""
        out = []
        for x in values:
            if x is None or math.isnan(x):
                out.append(math.nan)
                continue
            self.total = self.weight * self.total + (1 - self.weight) * x
            self.count += 1
            out.append(self.total / (1 - self.weight**self.count))
        return out


def _gap(value: Any) -> Any:
    """A value as plotly draws it: NaN (a step without the value) as None, a gap; JSON has no NaN, and the
    widget's message to the browser would be refused with a warning in the cell."""
    return None if isinstance(value, float) and math.isnan(value) else value


def _plain(markup: str) -> str:
    """The text of the header's HTML: tags dropped, entities read, its two lines kept."""
    return html.unescape(re.sub(r"<[^>]+>", "", markup.replace("<br>", "\n")))


def _rollout_version(session) -> str:
    """ " · rollout vN" while an agent rollout is live (nothing for single-turn generation)."""
    records = [r for r in session.registry.records if r.kind == "rollout" and r.status == "live"]
    return f" &middot; rollout v{records[0].version}" if records and records[0].version else ""
