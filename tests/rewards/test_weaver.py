"""The latent-variable fit over weak verifiers' votes: it recovers each verifier's rates without labels."""

import numpy as np
import pytest

from forge_nb.rewards import weaver


def _votes(n, prior, tpr, tnr, seed=0, abstain=0.0):
    """Votes [n, K] drawn from the model the fit assumes, and the true labels [n]."""
    rng = np.random.default_rng(seed)
    y = rng.random(n) < prior
    tpr, tnr = np.asarray(tpr), np.asarray(tnr)
    p_yes = np.where(y[:, None], tpr, 1 - tnr)
    votes = (rng.random((n, len(tpr))) < p_yes).astype(float)
    votes[rng.random(votes.shape) < abstain] = np.nan
    return votes, y


def test_the_fit_recovers_rates_and_prior_without_labels():
    tpr, tnr = [0.95, 0.8, 0.7, 0.6, 0.9], [0.9, 0.6, 0.75, 0.7, 0.55]
    votes, y = _votes(20000, 0.3, tpr, tnr)
    fit = weaver.fit(votes)
    assert fit.converged and abs(fit.prior - 0.3) < 0.02
    assert np.allclose(fit.tpr, tpr, atol=0.03) and np.allclose(fit.tnr, tnr, atol=0.03)


def test_the_posterior_beats_majority_vote_when_verifiers_differ_in_quality():
    # One good verifier and four near-chance ones: majority listens to the crowd, the fit to the good one.
    votes, y = _votes(5000, 0.4, [0.95, 0.6, 0.6, 0.6, 0.6], [0.95, 0.55, 0.55, 0.55, 0.55], seed=1)
    ensemble = (weaver.posterior(weaver.fit(votes), votes) > 0.5) == y
    majority = (weaver.majority_vote(votes) > 0.5) == y
    best_single = max(((votes[:, k] > 0.5) == y).mean() for k in range(votes.shape[1]))
    assert ensemble.mean() >= best_single - 0.01 and ensemble.mean() > majority.mean() + 0.1


def test_the_posterior_is_calibrated_when_the_model_holds():
    votes, y = _votes(20000, 0.5, [0.8, 0.75, 0.7, 0.65], [0.7, 0.75, 0.8, 0.65], seed=2)
    p = weaver.posterior(weaver.fit(votes), votes)
    bins = np.minimum((p * 10).astype(int), 9)
    ece = sum(abs(p[bins == b].mean() - y[bins == b].mean()) * (bins == b).mean() for b in np.unique(bins))
    assert ece < 0.03


def test_abstentions_drop_out_and_a_sample_nobody_voted_on_gets_the_prior():
    votes, _ = _votes(5000, 0.3, [0.9, 0.8, 0.85], [0.9, 0.8, 0.7], seed=3, abstain=0.3)
    fit = weaver.fit(votes)
    assert np.allclose(fit.tpr, [0.9, 0.8, 0.85], atol=0.04)
    silent = np.full((1, 3), np.nan)
    assert weaver.posterior(fit, silent)[0] == pytest.approx(fit.prior)


def test_a_verifier_that_always_votes_the_same_carries_no_weight():
    votes, y = _votes(4000, 0.5, [0.9, 0.85, 0.8], [0.9, 0.85, 0.8], seed=4)
    constant = np.hstack([votes, np.ones((len(votes), 1))])
    fit = weaver.fit(constant)
    yes, _ = fit.weights
    assert abs(yes[-1]) < 0.01
    assert np.array_equal(weaver.posterior(fit, constant) > 0.5, weaver.posterior(weaver.fit(votes), votes) > 0.5)


def test_the_correct_class_is_the_one_the_verifiers_agree_with_even_when_it_is_rare():
    votes, y = _votes(5000, 0.1, [0.9, 0.85, 0.8, 0.9], [0.95, 0.9, 0.9, 0.85], seed=5)
    fit = weaver.fit(votes)
    assert abs(fit.prior - 0.1) < 0.02 and np.all(fit.tpr + fit.tnr > 1)


def test_a_warm_start_from_the_last_fit_needs_fewer_iterations():
    votes, _ = _votes(4000, 0.35, [0.9, 0.7, 0.8, 0.6], [0.8, 0.7, 0.6, 0.9], seed=6)
    cold = weaver.fit(votes)
    more, _ = _votes(4000, 0.35, [0.9, 0.7, 0.8, 0.6], [0.8, 0.7, 0.6, 0.9], seed=7)
    assert weaver.fit(more, init=cold).iterations < weaver.fit(more).iterations


def test_bad_shapes_are_refused():
    with pytest.raises(ValueError, match="samples, verifiers"):
        weaver.fit(np.zeros(5))


def test_a_verifier_that_duplicates_another_is_found():
    votes, _ = _votes(2000, 0.4, [0.9, 0.8, 0.7], [0.8, 0.9, 0.7], seed=8)
    copied = np.hstack([votes, votes[:, :1], 1 - votes[:, 1:2]])  # a copy of the first, a mirror of the second
    assert weaver.redundant(copied).tolist() == [-1, -1, -1, 0, 1]
