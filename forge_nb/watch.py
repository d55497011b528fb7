"""Watches: conditions checked at every step boundary that pause the run when they fire, like breakpoints.

    w = s.watch(all_equal_groups=0.8, reward_dominance=0.9, length_drift=0.5, kl_spike=0.05,
                grad_norm=50.0, when=lambda row: row["mean_reward"] < 0.1)

- ``all_equal_groups``: the share of groups whose rewards are all equal (no learning signal) is above it;
- ``reward_dominance``: one reward member makes more than this share of the weighted reward
  (|weight x mean|, over the members, when several are live);
- ``length_drift``: the mean completion length moved by more than this fraction from its first steps'
  (the baseline: the first `baseline_steps` steps watched);
- ``kl_spike``: the trainer-vs-generator KL on the batch's tokens (``approx_kl``) is above it;
- ``grad_norm``: the gradient norm is NaN or above it;
- ``when``: a Python predicate over the step row (a dict: step, mean_reward, loss, ...) is true.

When one fires, the background run pauses after the step (the actors stay warm; `s.resume()` goes
on) and `s.step(n)` stops there; the watch keeps what fired (`fired`: the condition, the step, a
message and the batch as a table) and shows it where it was displayed.
"""

from __future__ import annotations

import math
import statistics
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import pandas as pd

from forge_nb.errors import SessionError

if TYPE_CHECKING:
    from forge_nb.rl.rollout import Rollout

BATCH_COLUMNS = ("group_id", "prompt", "completion", "target", "reward", "advantage", "num_tokens")


@dataclass(frozen=True)
class StepView:
    """What a condition sees at a step boundary: the step row, the batch, the train metrics and the
    weights of the live reward members."""

    row: dict[str, Any]
    rollout: Rollout
    train: dict[str, Any]
    weights: dict[str, float]


@dataclass
class Fired:
    """A condition that fired: which, at which step, why, and the batch (one row per sample)."""

    condition: str
    step: int
    message: str
    batch: pd.DataFrame


def all_equal_groups(view: StepView, above: float) -> str | None:
    groups: dict[int, set[float]] = {}
    for e in view.rollout.episodes:
        groups.setdefault(e.group_id, set()).add(round(e.reward, 12))
    share = sum(len(values) == 1 for values in groups.values()) / max(1, len(groups))
    return f"{share:.0%} of the groups have all-equal rewards (> {above:.0%})" if share > above else None


def reward_dominance(view: StepView, above: float) -> str | None:
    members = [name for name in view.weights if view.weights[name] != 0]
    if len(members) < 2:
        return None
    means = {n: statistics.fmean(e.rewards.get(n, 0.0) for e in view.rollout.episodes) for n in members}
    parts = {n: abs(view.weights[n] * means[n]) for n in members}
    total = sum(parts.values())
    name = max(parts, key=parts.get)
    share = parts[name] / total if total > 0 else 0.0
    return f"reward {name!r} makes {share:.0%} of the weighted reward (> {above:.0%})" if share > above else None


def kl_spike(view: StepView, above: float) -> str | None:
    kl = view.train.get("approx_kl")
    return f"trainer-vs-generator KL {kl:.3g} on the batch (> {above:g})" if kl is not None and kl > above else None


def grad_norm(view: StepView, above: float) -> str | None:
    norm = view.train.get("grad_norm")
    if norm is None:
        return None
    if not math.isfinite(norm):
        return f"gradient norm is {norm}"
    return f"gradient norm {norm:.3g} (> {above:g})" if norm > above else None


# Conditions that compare one step with a threshold; `length_drift` compares with a baseline the watch keeps.
THRESHOLD_CHECKS = {
    "all_equal_groups": all_equal_groups,
    "reward_dominance": reward_dominance,
    "kl_spike": kl_spike,
    "grad_norm": grad_norm,
}
CONDITIONS = (*THRESHOLD_CHECKS, "length_drift")  # every name `Session.watch` and `%forge watch` take


@dataclass
class Watch:
    """The conditions watched, and what fired. Display it (a notebook shows it live) or read `fired`."""

    thresholds: dict[str, float]
    when: Callable[[dict], bool] | None = None
    baseline_steps: int = 5
    fired: list[Fired] = field(default_factory=list)
    _lengths: list[float] = field(default_factory=list)
    _output: Any = None

    def check(self, view: StepView) -> Fired | None:
        """The first condition that fires on this step (and is kept), or None. It is shown where the
        watch was displayed, and in the running cell too when a cell runs the step (`s.step`, not a run)."""
        here = threading.current_thread() is threading.main_thread()
        found = self._first(view)
        if found is None:
            return None
        condition, message = found
        fired = Fired(condition, view.row["step"], message, view.rollout.to_pandas())
        self.fired.append(fired)
        self._show(fired, here)
        return fired

    @classmethod
    def of(cls, thresholds: dict[str, float], when: Callable[[dict], bool] | None, baseline_steps: int) -> Watch:
        """A watch of `thresholds` (names from `CONDITIONS`); an unknown name is a `SessionError`."""
        unknown = sorted(set(thresholds) - set(CONDITIONS))
        if unknown:
            names = ", ".join(CONDITIONS)
            raise SessionError(f"forge_nb: no watch condition {unknown[0]!r}; conditions: {names}, when")
        return cls(dict(thresholds), when, baseline_steps)

    def _first(self, view: StepView) -> tuple[str, str] | None:
        for name, check in THRESHOLD_CHECKS.items():
            if name in self.thresholds and (message := check(view, self.thresholds[name])):
                return name, message
        if "length_drift" in self.thresholds and (message := self._length_drift(view)):
            return "length_drift", message
        if self.when is not None and self.when(dict(view.row)):
            return "when", f"the predicate {getattr(self.when, '__name__', 'when')} is true for step {view.row['step']}"
        return None

    def _length_drift(self, view: StepView) -> str | None:
        mean = view.rollout.num_tokens / max(1, len(view.rollout.episodes))
        if len(self._lengths) < self.baseline_steps:
            self._lengths.append(mean)
            return None
        base = statistics.fmean(self._lengths)
        drift = abs(mean - base) / base if base > 0 else 0.0
        limit = self.thresholds["length_drift"]
        return (
            f"mean completion length {mean:.1f} tokens, {drift:.0%} from its first steps' {base:.1f}"
            if drift > limit
            else None
        )

    def widget(self):
        """An output area showing the conditions, then each firing with its batch."""
        import ipywidgets as widgets

        if self._output is None:
            self._output = widgets.Output()
            watched = ", ".join(f"{k} {v:g}" for k, v in self.thresholds.items())
            self._output.append_stdout(f"forge_nb watch: {watched}{' + predicate' if self.when else ''}\n")
        return self._output

    def _show(self, fired: Fired, here: bool) -> None:
        text = f"forge_nb watch fired at step {fired.step}: {fired.condition}: {fired.message}; the run is paused\n"
        columns = [c for c in BATCH_COLUMNS if c in fired.batch.columns]
        table = fired.batch[columns].head(32)
        if self._output is not None:
            self._output.append_stdout(text)
            self._output.append_display_data(table)
        if self._output is None or here:
            from IPython.display import display

            print(text, end="")
            display(table)

    def _ipython_display_(self) -> None:
        from IPython.display import display

        display(self.widget())
