"""Which panels a run's dashboard shows, with what labels: one choice for the live widget and its picture.

A panel, and a series in it, appears only when the run has data for it: the judge's panels once a judge
row arrived, the agent's once a batch had trajectories, KL to the reference only with a reference, the
held-out accuracy once an evaluation ran (``eval.every``), a phase of the step only when it took time.
Two cases are judged, not just read:

- task accuracy is drawn beside the mean reward only where they differ; where the reward is the task's
  own check they are one number, and the panel's title says so instead of drawing two equal lines;
- refresh GB/s only where a refresh moved real bytes (`REAL_BYTES`): a few MB move in a time set by the
  round trips, not the link, and their "GB/s" is not a bandwidth;
- the clip fraction only once a step clipped a token: on-policy (one step a batch, no staleness) every ratio is 1
  and the panel would be a line on its axis.

`shown(rows)` takes the metrics stream's rows by kind (``{"step": [...], "judge": [...], "eval": [...]}``,
eval rows through `eval_row`) and returns the panels to draw, in order, each with the series that have data.
The held-out panel needs evaluations at two steps or more: one evaluation is a number, not a curve.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PHASES = ("generate_s", "score_s", "reference_s", "train_s", "refresh_s")  # stacked: their sum ~ step time
REAL_BYTES = 64 * 2**20  # smaller refreshes measure round trips, not bandwidth


@dataclass(frozen=True)
class Panel:
    """A plot: its title, the y axis's label (with the unit), the columns drawn, from rows of `kind`."""

    title: str
    unit: str
    series: tuple[str, ...]
    kind: str = "step"


PANELS = (
    Panel("reward and task accuracy", "mean per sample", ("mean_reward", "accuracy")),
    Panel("held-out accuracy", "share correct", ("heldout_greedy", "heldout_sampled"), "eval"),
    Panel("generated tokens/s", "tokens / s", ("tokens_per_s",)),
    Panel("time per phase", "seconds per step", PHASES),
    Panel("refresh bandwidth", "GB/s (1e9 bytes / s)", ("refresh_gbps",)),
    Panel("judge verdicts/s", "verdicts / s", ("verdicts_per_s",), "judge"),
    Panel("judge latency per call", "seconds", ("latency_s",), "judge"),
    Panel("agent: model calls per trajectory", "calls", ("turns",)),
    Panel("agent: tool calls per step", "calls", ("tool_calls", "tool_errors")),
    Panel("policy entropy", "nats per token", ("entropy",)),
    Panel("response length", "policy tokens", ("response_length", "response_length_max")),
    Panel("clip fraction", "share clipped (tokens; GSPO: sequences)", ("clip_fraction",)),
    Panel("KL to the reference (k3)", "nats per token", ("kl_ref",)),
)
# Shown before the first step, so a new dashboard is not an empty box.
FIRST = ("reward and task accuracy", "generated tokens/s")


def eval_row(row: Mapping[str, Any]) -> dict[str, Any]:
    """An "eval" row with its accuracy under the column of how it was read: greedy (one answer per problem)
    or sampled (several, at the sampling temperature) -- two different numbers, never one line."""
    how = "heldout_greedy" if row.get("eval_greedy", 1.0) else "heldout_sampled"
    return {**row, how: row.get("heldout_accuracy")}


def shown(rows: Mapping[str, Sequence[Mapping[str, Any]]]) -> list[Panel]:
    """The panels with data in `rows` (by kind), each with only its series that have data."""
    out = []
    for panel in PANELS:
        mine = rows.get(panel.kind) or []
        if panel.kind == "step" and not mine:  # no step yet: the reward and throughput panels wait
            out.extend([panel] if panel.title in FIRST else [])
            continue
        if panel.kind == "eval" and len({r.get("step") for r in mine}) < 2:
            continue
        series = tuple(name for name in panel.series if _has_data(name, mine))
        if panel.title == FIRST[0]:
            series = ("mean_reward",) + (("accuracy",) if "accuracy" in series else ())
            if "accuracy" not in series:  # equal to the reward in every step: one line, said in the title
                panel = dataclasses.replace(panel, title="reward (= task accuracy)")
        if series:
            out.append(dataclasses.replace(panel, series=series))
    return out


def _has_data(name: str, rows: Sequence[Mapping[str, Any]]) -> bool:
    if name == "accuracy":
        return any(_value(r, name) is not None and _value(r, name) != _value(r, "mean_reward") for r in rows)
    if name == "refresh_gbps":
        return any((_value(r, "refresh_bytes") or 0) >= REAL_BYTES and (_value(r, name) or 0) > 0 for r in rows)
    if name in PHASES or name in ("tool_errors", "clip_fraction"):  # (on-policy nothing is clipped: no panel of 0s)
        return any((_value(r, name) or 0) > 0 for r in rows)
    return any(_value(r, name) is not None for r in rows)


def _value(row: Mapping[str, Any], name: str) -> float | None:
    """`row[name]` as a number, None where it is missing or NaN (older rows lack newer columns)."""
    x = row.get(name)
    if x is None or isinstance(x, str):
        return None
    x = float(x)
    return None if math.isnan(x) else x
