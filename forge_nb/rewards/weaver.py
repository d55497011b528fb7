"""Weak verifiers combined without labels: a latent-variable fit over their votes, in the spirit of
Weaver (Saad-Falcon et al., 2025), which applies weak supervision to LLM verifiers.

The model (Dawid-Skene, binary): each sample is correct (y = 1) with probability `prior`; verifier k
votes 1 with probability tpr[k] if it is and 1 - tnr[k] if it is not, independently of the other
verifiers given y. Nothing needs a label: EM alternates the posterior P(y = 1 | votes) of every
sample (E-step) with the prior and rates that best explain all the votes under it (M-step), starting
from the majority vote. Beta pseudo-counts (`smoothing`) keep the rates off 0 and 1, so a verifier
that always votes the same gets a likelihood ratio near 1 (no weight) instead of a veto. Like
Weaver, the fit assumes the verifiers are better than chance on average, which fixes which latent
class is "correct" (EM alone cannot tell a model from its mirror image).

The posterior is the reward: a probability of correctness, calibrated as far as the verifiers'
errors are independent given y. Verifiers that (nearly) duplicate one another break that assumption
worst -- two copies of a format check outvote everything else, and the fit then models "is it well
formatted" instead of "is it correct" -- so `redundant` finds them and the fit keeps one of each.

Shapes: votes [N, K] floats, 1 (looks correct), 0 (looks wrong) or NaN (abstains); fractional votes
count fractionally. Plain numpy: this runs in the reward procs on every batch.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

PRIOR_BOUNDS = (0.005, 0.995)


@dataclass(frozen=True)
class Fit:
    """The fitted model: P(correct), and each verifier's true-positive and true-negative rates [K]."""

    prior: float
    tpr: np.ndarray  # P(vote 1 | correct)
    tnr: np.ndarray  # P(vote 0 | wrong)
    iterations: int = 0
    converged: bool = True

    @property
    def accuracy(self) -> np.ndarray:
        """Each verifier's expected accuracy under the fit [K] (abstentions aside)."""
        return self.prior * self.tpr + (1 - self.prior) * self.tnr

    @property
    def weights(self) -> tuple[np.ndarray, np.ndarray]:
        """Log-likelihood ratios [K] of a vote 1 and of a vote 0 (how far each moves the log odds)."""
        return np.log(self.tpr / (1 - self.tnr)), np.log((1 - self.tpr) / self.tnr)


def redundant(votes: np.ndarray, max_correlation: float = 0.95) -> np.ndarray:
    """For each verifier [K], the index of an earlier one whose votes it (nearly) duplicates -- |phi
    correlation| >= `max_correlation` on the samples both voted on -- or -1 if it duplicates none."""
    k = votes.shape[1]
    same = np.full(k, -1)
    for j in range(k):
        for i in range(j):
            if same[i] >= 0:
                continue
            both = ~np.isnan(votes[:, i]) & ~np.isnan(votes[:, j])
            a, b = votes[both, i], votes[both, j]
            if len(a) > 1 and a.std() > 0 and b.std() > 0 and abs(np.corrcoef(a, b)[0, 1]) >= max_correlation:
                same[j] = i
                break
    return same


def majority_vote(votes: np.ndarray) -> np.ndarray:
    """Share of the non-abstaining votes of each sample that say correct [N] (0.5 where all abstain)."""
    seen = ~np.isnan(votes)
    counts = seen.sum(1)
    share = np.where(seen, votes, 0.0).sum(1) / np.maximum(counts, 1)
    return np.where(counts > 0, share, 0.5)


def log_odds(fit: Fit, votes: np.ndarray) -> np.ndarray:
    """log P(correct | votes) / P(wrong | votes) of each sample [N]."""
    return _log_odds(fit, *_split(votes))


def posterior(fit: Fit, votes: np.ndarray) -> np.ndarray:
    """P(correct | votes) of each sample [N] in (0, 1)."""
    return _sigmoid(log_odds(fit, votes))


def fit(
    votes: np.ndarray, init: Fit | None = None, max_iter: int = 100, tol: float = 1e-4, smoothing: float = 1.0
) -> Fit:
    """EM over `votes` [N, K] -> `Fit`. `init` (an earlier fit, e.g. on the previous window) starts
    from its posterior instead of the majority vote, which saves most iterations."""
    votes = np.asarray(votes, dtype=np.float64)
    if votes.ndim != 2 or votes.shape[1] == 0:
        raise ValueError(f"votes must be [samples, verifiers] with at least one verifier, got shape {votes.shape}")
    if init is not None and len(init.tpr) != votes.shape[1]:
        init = None
    yes, no = _split(votes)
    q = majority_vote(votes) if init is None else _sigmoid(_log_odds(init, yes, no))
    current, iterations, converged = None, 0, False
    while iterations < max_iter and not converged:
        current = _m_step(q, yes, no, smoothing)
        new_q = _sigmoid(_log_odds(current, yes, no))
        converged = bool(np.max(np.abs(new_q - q), initial=0.0) < tol)
        q, iterations = new_q, iterations + 1
    current = _better_than_chance(current)
    return Fit(current.prior, current.tpr, current.tnr, iterations, converged)


def _split(votes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Votes [N, K] -> how much each one says correct and how much wrong, [N, K] each (0 and 0 where
    it abstains), so that the sums EM needs are matrix products."""
    seen = ~np.isnan(votes)
    yes = np.where(seen, votes, 0.0)
    return yes, seen - yes


def _log_odds(fit: Fit, yes: np.ndarray, no: np.ndarray) -> np.ndarray:
    weight_yes, weight_no = fit.weights
    return np.log(fit.prior / (1 - fit.prior)) + yes @ weight_yes + no @ weight_no


def _sigmoid(x: np.ndarray) -> np.ndarray:
    return 1.0 / (1.0 + np.exp(-np.clip(x, -50, 50)))


def _m_step(q: np.ndarray, yes: np.ndarray, no: np.ndarray, smoothing: float) -> Fit:
    """The prior and rates that maximise the expected (smoothed) likelihood under posteriors `q` [N]."""
    prior = float(np.clip(q.mean() if len(q) else 0.5, *PRIOR_BOUNDS))
    seen = yes + no
    tpr = (q @ yes + smoothing) / (q @ seen + 2 * smoothing)  # expected votes 1 among correct samples / their votes
    tnr = ((1 - q) @ no + smoothing) / ((1 - q) @ seen + 2 * smoothing)
    return Fit(prior, np.clip(tpr, 1e-4, 1 - 1e-4), np.clip(tnr, 1e-4, 1 - 1e-4))


def _better_than_chance(fit: Fit) -> Fit:
    """The same model with the classes named so that the verifiers beat chance on average."""
    if np.mean(fit.tpr + fit.tnr) >= 1.0:
        return fit
    return Fit(1 - fit.prior, 1 - fit.tnr, 1 - fit.tpr)
