"""Sample explorer (`%forge explore`): from a point on the reward curve to that step's groups, to one
sample's tokens; prompts pinned across steps; any prompt sent to the live generator.

It reads the rollout log (`run.rollout_log`), so every step's samples are there, not only the last
ones. Per group: each sample's completion, its reward and each reward member's score, advantage,
policy version and staleness. Per sample: its tokens coloured by how far the trainer's logprob
(computed in the train step, same policy version) is from the generator's (sampling), both in the
tooltip.
"""

from __future__ import annotations

import html
import json
import threading
from collections.abc import Callable
from typing import Any

import ipywidgets as widgets
import pandas as pd
import plotly.graph_objects as go

from forge_nb.notebook.fit_width import fit_width

GROUP_COLUMNS = ["sample_id", "completion", "reward", "advantage", "policy_version", "staleness", "finish_reason"]


class Explorer:
    """The widget; `show_step(step)` and `pin(prompt_id)` do what the clicks do."""

    def __init__(
        self, session, figure: go.FigureWidget | None = None, on_show: Callable[[int], None] | None = None
    ) -> None:
        self.session, self.on_show = session, on_show
        self.figure = figure if figure is not None else _reward_figure(session)
        self.listen(self.figure)
        self.title = widgets.HTML("<b>Click a point of the reward curve to open that step's groups.</b>")
        self.groups = widgets.HTML()
        self.sample = widgets.Dropdown(description="sample", options=[], layout={"width": "260px"})
        self.sample.observe(lambda change: self._show_tokens(change["new"]), names="value")
        self.tokens = widgets.HTML()
        self.pin_box = widgets.Text(placeholder="prompt id", layout={"width": "220px"})
        pin = widgets.Button(description="Pin prompt", icon="thumb-tack")
        pin.on_click(lambda _: self.pin(self.pin_box.value.strip()))
        self.pinned = widgets.HTML()
        self.prompt = widgets.Textarea(placeholder="a prompt for the live generator", layout={"width": "60%"})
        send = widgets.Button(description="Generate", icon="play")
        send.on_click(lambda _: self._generate())
        self.generated = widgets.HTML()
        self._step_rows: pd.DataFrame | None = None
        self._pins: list[str] = []
        self.widget = fit_width(
            widgets.VBox(
                [
                    *([] if figure is not None else [self.figure]),
                    self.title,
                    self.groups,
                    widgets.HBox([self.sample]),
                    self.tokens,
                    widgets.HBox([self.pin_box, pin]),
                    self.pinned,
                    widgets.HBox([self.prompt, send]),
                    self.generated,
                ],
                layout={"width": "100%"},
            ),
            [] if figure is not None else [self.figure],
        )
        self.widget.add_class("forge-explorer")

    def _on_click(self, trace, points, selector) -> None:
        if points.point_inds:
            self.show_step(int(trace.x[points.point_inds[0]]))

    def listen(self, figure: go.FigureWidget) -> None:
        """A click on a point of `figure`'s reward curve opens that step (also on accuracy's points, which
        lie on the reward's and plotly may pick)."""
        for trace in figure.data:
            if trace.meta in (None, "mean_reward", "accuracy"):
                trace.on_click(self._on_click)

    def show_step(self, step: int) -> None:
        """Open `step`'s groups (from the rollout log)."""
        try:
            rows = self.session.samples(step=step)
        except Exception as e:  # the log is off, or unreadable: say so where the groups would be
            self.title.value = f"<b>Step {step}</b>: <span style='color:#b00'>{html.escape(str(e))}</span>"
            return
        self._step_rows = rows
        if self.on_show is not None:
            self.on_show(step)
        if rows.empty:
            self.title.value = f"<b>Step {step}</b>: no samples in the rollout log (is log.samples off?)"
            self.groups.value, self.sample.options = "", []
            return
        trained = int(rows.trained.sum())
        self.title.value = (
            f"<b class='forge-explorer-step'>Step {step}</b>: {len(rows)} samples in "
            f"{rows.group_id.nunique()} groups, {trained} trained, mean reward {rows.reward.mean():.3f}"
        )
        self.groups.value = "".join(_group_html(group) for _, group in rows.groupby("group_id", sort=True))
        self.sample.options = [(f"#{s} ({p[:20]})", s) for s, p in zip(rows.sample_id, rows.prompt_id)]

    def _show_tokens(self, sample_id: int | None) -> None:
        if sample_id is None or self._step_rows is None:
            self.tokens.value = ""
            return
        row = self._step_rows[self._step_rows.sample_id == sample_id].iloc[0]
        pieces = [self.session.tokenizer.decode([t]) for t in row.completion_ids]
        turns, mask = getattr(row, "turns", None), getattr(row, "completion_mask", None)  # multi-turn samples only
        self.tokens.value = _turns_html(turns if isinstance(turns, str) else None) + _tokens_html(
            pieces, list(row.logprobs), row.trainer_logprobs, None if mask is None or len(mask) == 0 else list(mask)
        )

    def pin(self, prompt_id: str) -> None:
        """Follow `prompt_id` across steps: its samples of every step, with rewards."""
        if prompt_id and prompt_id not in self._pins:
            self._pins.append(prompt_id)
        parts = []
        for pid in self._pins:
            rows = self.session.samples(prompt_id=pid)
            summary = rows.groupby("step").agg(samples=("sample_id", "size"), mean_reward=("reward", "mean"))
            parts.append(f"<div><b>{html.escape(pid)}</b>{summary.round(3).to_html()}</div>")
        self.pinned.value = "".join(parts)

    def _generate(self) -> None:
        text = self.prompt.value.strip()
        if not text:
            return
        self.generated.value = "<i>generating...</i>"

        def run() -> None:  # off the kernel's comm handler: generation waits for the batch in flight
            try:
                outs = self.session.generate(text, n=4)
                self.generated.value = "".join(f"<pre>{html.escape(o)}</pre>" for o in outs)
            except Exception as e:
                self.generated.value = f"<span style='color:#b00'>{html.escape(f'{type(e).__name__}: {e}')}</span>"

        threading.Thread(target=run, daemon=True, name="forge_nb-explorer").start()


def _reward_figure(session) -> go.FigureWidget:
    rows = session.metrics_stream.rows("step")
    fig = go.FigureWidget(
        data=[
            go.Scatter(
                x=[r["step"] for r in rows],
                y=[r["mean_reward"] for r in rows],
                mode="lines+markers",
                name="mean reward",
                meta="mean_reward",
            )
        ],
    )
    fig.update_layout(height=260, margin={"l": 40, "r": 10, "t": 30, "b": 30}, title="mean reward (click a step)")
    fig.update_xaxes(title_text="step", tickformat="d")
    unsubscribe = session.metrics_stream.subscribe(lambda row: _append(fig, row))
    fig._forge_unsubscribe = unsubscribe  # noqa: SLF001 (kept with the figure it feeds)
    return fig


def _append(fig: go.FigureWidget, row: dict[str, Any]) -> None:
    if row.get("kind") == "step":
        trace = fig.data[0]
        with fig.batch_update():
            trace.x, trace.y = (*trace.x, row["step"]), (*trace.y, row["mean_reward"])


def _group_html(group: pd.DataFrame) -> str:
    members = sorted(c for c in group.columns if c.startswith("reward/") and group[c].notna().any())
    columns = [c for c in GROUP_COLUMNS if c in group.columns] + members
    prompt = html.escape(str(group.prompt.iloc[0])[-160:])
    table = group[columns].round(3).to_html(index=False, classes="forge-group", escape=True)
    return (
        f"<details open><summary>group {group.group_id.iloc[0]} &middot; prompt {html.escape(group.prompt_id.iloc[0])}"
        f" &middot; target {html.escape(str(group.target.iloc[0]))}</summary><pre>...{prompt}</pre>{table}</details>"
    )


def _turns_html(turns: str | None) -> str:
    """A trajectory turn by turn (model call: reply, tokens, reward, tool calls / errors); '' for one completion."""
    if not turns:
        return ""
    rows = "".join(
        _new_segment_html(t.get("new_segment"))
        + f"<tr><td>{i}</td><td>{t['prompt_tokens']}</td><td>{t['completion_tokens']}</td><td>{t['finish_reason']}</td>"
        f"<td>{t['reward']:g}</td><td>{t['tool_calls']}/{t['tool_errors']}</td><td>{html.escape(t['text'][:120])}</td></tr>"
        for i, t in enumerate(json.loads(turns))
    )
    names = ("turn", "added", "generated", "finish", "reward", "tools/err", "reply")
    head = "<tr>" + "".join(f"<th>{n}</th>" for n in names) + "</tr>"
    return f"<table class='forge-turns'>{head}{rows}</table>"


def _new_segment_html(why: str | None) -> str:
    """A row saying this turn starts a new segment (its prompt did not extend the previous call's), and why."""
    return f"<tr><td colspan='7'><i>new segment: {html.escape(why)}</i></td></tr>" if why else ""


def _tokens_html(pieces: list[str], generator: list[float], trainer: Any, mask: list[int] | None = None) -> str:
    """Each token on a background as red as |trainer - generator| logprob is large (0.5 nats: full); a
    trajectory's masked tokens (tool results, environment messages, template glue) in grey, untrained."""
    trained = trainer is not None and len(trainer) == len(generator)
    spans = []
    for i, (piece, g) in enumerate(zip(pieces, generator)):
        if mask is not None and not mask[i]:
            spans.append(
                f"<span class='forge-token-masked' title='masked: not trained' style='color: #888'>"
                f"{html.escape(piece) or '&#9251;'}</span>"
            )
            continue
        t = float(trainer[i]) if trained else None
        gap = abs(t - g) if t is not None else 0.0
        shade = min(1.0, gap / 0.5)
        tip = f"generator {g:.4f}" + (f", trainer {t:.4f}, gap {gap:.4f}" if t is not None else ", not trained")
        spans.append(
            f"<span class='forge-token' title='{tip}' style='background: rgba(220, 40, 40, {shade:.2f})'>"
            f"{html.escape(piece) or '&#9251;'}</span>"
        )
    note = "trainer vs generator logprobs (hover a token)" if trained else "generator logprobs (not trained)"
    return f"<div><i>{note}</i></div><div style='font-family: monospace; white-space: pre-wrap'>{''.join(spans)}</div>"
