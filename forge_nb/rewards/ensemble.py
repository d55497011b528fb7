"""A label-free reward: many weak verifiers, combined by a latent-variable fit over their votes.

    from forge_nb.rewards import Ensemble, addition_verifiers, judge

    s.set_reward(Ensemble(addition_verifiers()))                     # the exact-match reward, replaced
    s.set_reward(Ensemble([*numeric_verifiers(), judge()]), name="ensemble")

On every batch the ensemble collects each verifier's votes (`votes`: [N, K], per-sample verifiers
called per sample, batched ones -- `agreement`, a `Judge` -- once), fits each verifier's accuracy
without labels over the last `window` samples this proc has scored (`rewards.weaver`, warm-started
from the previous fit; a verifier that duplicates another's votes there is left out of it), and
returns P(correct) per sample: a calibrated probability as the reward.
It never sees the targets: they are taken out of the columns before any verifier is called.

Graded votes (a judge's probability) are cut at their mean over the window, so every verifier votes
0 or 1 (as Weaver binarises its verifiers' scores). `report()` shows the last fit.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from forge_nb.rewards import weaver
from forge_nb.rewards.forms import is_batched, keywords_for
from forge_nb.rewards.prompt_text import as_text

if TYPE_CHECKING:
    import pandas as pd  # imported where a table is made: not in every proc that imports this module

_RUNTIME = ("_history", "_fit", "_same")  # what a proc learns while scoring; never travels with the reward


class Ensemble:
    """Weak verifiers -> P(correct) per sample, their accuracies estimated without labels."""

    def __init__(
        self,
        verifiers: list[Callable],
        names: list[str] | None = None,
        window: int = 2048,
        smoothing: float = 1.0,
        max_iter: int = 100,
    ) -> None:
        if not verifiers:
            raise ValueError("Ensemble needs at least one verifier")
        self.verifiers = list(verifiers)
        self.names = list(names) if names is not None else [_name(v) for v in self.verifiers]
        if len(self.names) != len(self.verifiers) or len(set(self.names)) != len(self.names):
            raise ValueError(f"Ensemble: give each verifier a distinct name; got {self.names}")
        self.window, self.smoothing, self.max_iter = window, smoothing, max_iter

    def __getstate__(self) -> dict:
        """The configuration only: what it learned while scoring stays where it learned it."""
        return {k: v for k, v in self.__dict__.items() if k not in _RUNTIME}

    def __call__(self, prompts: list[str], completions: list[str], **columns: list) -> list[float]:
        votes = self.votes(prompts, completions, **columns)
        history = getattr(self, "_history", None)
        window = votes if history is None else np.concatenate([history, votes])[-self.window :]
        cuts = thresholds(window)
        binary = binarize(window, cuts)
        self._same = weaver.redundant(binary)
        kept = self._same < 0
        self._fit = weaver.fit(binary[:, kept], getattr(self, "_fit", None), self.max_iter, smoothing=self.smoothing)
        self._history = window
        return weaver.posterior(self._fit, binarize(votes, cuts)[:, kept]).tolist()

    def votes(self, prompts: list[str], completions: list[str], **columns: list) -> np.ndarray:
        """Every verifier's vote on every sample -> [N, K]: 1, 0, a grade in between, or NaN (abstains)."""
        # per-sample columns only (not TRL's trainer_state, log_extra, ...), the texts of chat messages
        columns = {k: v for k, v in columns.items() if k != "targets" and isinstance(v, list | tuple)}
        columns = {
            **columns,
            "prompts": [as_text(p) for p in prompts],
            "completions": [as_text(c) for c in completions],
        }
        out = np.full((len(completions), len(self.verifiers)), np.nan)
        for k, verifier in enumerate(self.verifiers):
            out[:, k] = [_vote(v) for v in _call(verifier, columns)]
        return out

    def report(self) -> pd.DataFrame:
        """The last fit, one row per verifier: estimated tpr, tnr and accuracy, the log-odds a vote of
        1 and of 0 adds, and which verifier it duplicates if it was left out (empty before the first
        batch). ``attrs``: the estimated share correct ("prior") and the window's size."""
        import pandas as pd

        columns = ["verifier", "tpr", "tnr", "accuracy", "weight_yes", "weight_no", "duplicates"]
        fit = getattr(self, "_fit", None)
        if fit is None:
            return pd.DataFrame(columns=columns)
        yes, no = fit.weights
        fitted = iter(zip(fit.tpr, fit.tnr, fit.accuracy, yes, no))
        rows = [
            [name, *(next(fitted) if same < 0 else [math.nan] * 5), self.names[same] if same >= 0 else None]
            for name, same in zip(self.names, self._same)
        ]
        df = pd.DataFrame(rows, columns=columns)
        df.attrs["prior"], df.attrs["samples"] = fit.prior, len(self._history)
        return df

    def __repr__(self) -> str:
        return f"Ensemble({', '.join(self.names)}; window {self.window})"


def thresholds(votes: np.ndarray) -> np.ndarray:
    """Per verifier [K]: 0.5 for one that votes 0 / 1, the mean of its grades for one that grades."""
    graded = np.nanmax(np.where(np.isnan(votes), 0.0, np.minimum(votes, 1 - votes)), axis=0, initial=0.0) > 0
    means = np.array([np.nanmean(col) if np.any(~np.isnan(col)) else 0.5 for col in votes.T])
    return np.where(graded, means, 0.5)


def binarize(votes: np.ndarray, cuts: np.ndarray) -> np.ndarray:
    """Votes [N, K] cut at `cuts` [K] (1 above, 0 below; a 0 / 1 vote stays as it is); NaN stays."""
    return np.where(np.isnan(votes), np.nan, (votes > cuts).astype(np.float64))


def _call(verifier: Callable, columns: dict[str, list]) -> list:
    if is_batched(verifier):
        out = verifier(**keywords_for(verifier)(columns))
        return list(out)
    context = keywords_for(verifier)
    extra = {k: v for k, v in columns.items() if k not in ("prompts", "completions")}
    prompts, completions = columns["prompts"], columns["completions"]
    if not context({name: None for name in extra}):  # it takes the prompt and completion only
        return [verifier(p, c) for p, c in zip(prompts, completions)]
    return [
        verifier(p, c, **context({k: v[i] for k, v in extra.items()}))
        for i, (p, c) in enumerate(zip(prompts, completions))
    ]


def _vote(value) -> float:
    if value is None:
        return math.nan
    value = float(value)
    return min(1.0, max(0.0, value)) if math.isfinite(value) else math.nan


def _name(verifier: Callable) -> str:
    return getattr(verifier, "__name__", None) or type(verifier).__name__.lower()
