"""The auditor's own arithmetic (``audit.py``): the Clopper-Pearson bound is the exact binomial one, the empirical
lower bound never exceeds the true epsilon of mechanisms whose epsilon is known exactly (the Gaussian mechanism, by
the analytic formula; randomised response) and comes close to it where its tails are within reach, and the
planning figures the mechanisms' audits quote are these functions'."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from audit import (
    clopper_pearson_upper,
    epsilon_lower_bound,
    gaussian_bound,
    samples_needed,
    unit_thresholds,
)
from audit_mechanisms import affine, measured
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from common.privacy.gaussian import gaussian_epsilon, gaussian_mu

FEW = settings(max_examples=12, deadline=None, derandomize=True)


def gaussian_scores(mu: float, n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``n`` scores a side of a Gaussian mechanism of ratio ``mu``, standardised: ``N(0, 1)`` and ``N(mu, 1)``."""
    rng = np.random.default_rng(seed)
    return rng.standard_normal(n), mu + rng.standard_normal(n)


def test_the_clopper_pearson_bound_is_the_exact_binomial_one():
    """No event in ``n``: ``1 - alpha^(1/n)`` exactly; otherwise the rate at which ``k`` or fewer events have
    probability ``alpha``; all of them: 1. An interval narrower than this would let the auditor claim more than
    its samples show."""
    n, alpha = 1000, 0.01
    assert clopper_pearson_upper(np.array([0]), n, alpha)[0] == pytest.approx(1 - alpha ** (1 / n), rel=1e-9)
    for k in (1, 17, 500):
        p = clopper_pearson_upper(np.array([k]), n, alpha)[0]
        assert stats.binom.cdf(k, n, p) == pytest.approx(alpha, rel=1e-6)
    assert clopper_pearson_upper(np.array([n]), n, alpha)[0] == 1.0
    upper = clopper_pearson_upper(np.arange(0, n + 1, 50), n, alpha)
    assert (np.diff(upper) > 0).all()


@FEW
@given(
    mu=st.floats(0.1, 3.0),
    delta=st.sampled_from([1e-1, 1e-3, 1e-5]),
    seed=st.integers(0, 2**32 - 1),
)
def test_on_a_gaussian_mechanism_the_bound_stays_below_its_analytic_epsilon(mu, delta, seed):
    """A Gaussian mechanism of ratio ``mu`` is exactly ``(epsilon(mu, delta), delta)``-DP (the analytic Gaussian
    mechanism): an auditor whose bound exceeded it would accuse a correct mechanism (a Bonferroni or
    Clopper-Pearson slip, a threshold chosen on the samples it is tested on)."""
    null, alt = gaussian_scores(mu, 20_000, seed)
    bound = epsilon_lower_bound(null, alt, delta, unit_thresholds())
    assert bound.epsilon < gaussian_epsilon(mu, delta)


def test_with_many_samples_the_bound_comes_close_to_the_analytic_epsilon():
    """Where the tails that decide epsilon are within reach (``mu = 1``, ``delta = 0.1``: the best test rejects at
    about 1.6 deviations), 10^6 releases a side give a bound within 5 % of the analytic ``epsilon`` 1.16, and more
    releases give more: the auditor has the power the mechanisms' audits count on."""
    exact = gaussian_epsilon(1.0, 0.1)
    bounds = [epsilon_lower_bound(*gaussian_scores(1.0, n, 7), 0.1, unit_thresholds()).epsilon for n in (10**4, 10**6)]
    assert bounds[0] < bounds[1] < exact
    assert bounds[1] > 0.95 * exact


def test_on_randomised_response_the_bound_stays_below_epsilon_and_reaches_it():
    """Randomised response (a bit kept with probability ``e^eps / (1 + e^eps)``) is ``(eps, 0)``-DP exactly, and
    one threshold test attains it: a second family, with pure DP, on which the bound is below ``eps`` and, with
    10^6 releases, within 0.05 of it."""
    eps = 1.0
    keep = math.exp(eps) / (1 + math.exp(eps))
    rng = np.random.default_rng(3)
    n = 10**6
    null = (rng.random(n) < 1 - keep).astype(np.float64)  # D: the bit is 0, reported 1 with probability 1 - keep
    alt = (rng.random(n) < keep).astype(np.float64)  # D': the bit is 1
    bound = epsilon_lower_bound(null, alt, 0.0, unit_thresholds())
    assert eps - 0.05 < bound.epsilon < eps
    assert bound.threshold < 1 and bound.above and bound.names_alt


def test_the_same_law_on_both_sides_shows_nothing():
    """Neighbours that the mechanism cannot tell apart (the same law): no test has power, the bound is at most 0."""
    rng = np.random.default_rng(5)
    null, alt = rng.standard_normal(10**5), rng.standard_normal(10**5)
    assert epsilon_lower_bound(null, alt, 1e-5, unit_thresholds()).epsilon <= 0.0


def test_the_bound_needs_as_many_scores_a_side():
    with pytest.raises(ValueError, match="as many scores of each side"):
        epsilon_lower_bound(np.zeros(3), np.zeros(4), 1e-5, unit_thresholds())


@pytest.mark.parametrize(
    ("epsilon", "needed"),
    [(2.0, 20_000), (8.0, 500_000)],
)
def test_a_factor_two_in_the_sensitivity_shows_with_these_many_releases(epsilon, needed):
    """The planning figure the mechanisms' audits quote: a Gaussian mechanism calibrated for sensitivity ``C`` whose
    true sensitivity is ``2 C`` has ratio ``2 mu(epsilon, delta)``; its expected bound exceeds the stated ``epsilon``
    from 2 x 10^4 releases a side at ``epsilon`` 2, but only from 5 x 10^5 at ``epsilon`` 8 (the test that refutes
    8 must reach beyond 4 deviations). A correct calibration's expected bound at those sizes stays well below."""
    mu = gaussian_mu(epsilon, 1e-5)
    assert samples_needed(2 * mu, 1e-5, epsilon) == needed
    assert gaussian_bound(mu, 1e-5, 10 * needed) < 0.8 * epsilon


class Linear:
    """A release ``m + A z`` of the source's draws ``z: (3,)``, optionally clamped at 0 (then not affine: the
    probes of ``A``'s columns, all positive, cannot tell, the seeded draws can)."""

    def __init__(self, clamp: bool = False) -> None:
        self.mean = (
            torch.zeros(3, dtype=torch.float64) if clamp else torch.tensor([1.0, -2.0, 0.5], dtype=torch.float64)
        )
        self.map = torch.tensor([[2.0, 0.0, 0.0], [0.0, 0.5, 0.5], [0.0, 0.0, 0.0]], dtype=torch.float64)
        self.clamp = clamp

    def __call__(self, source) -> torch.Tensor:
        out = self.mean + self.map @ source.normal((3,))
        return out.clamp(min=0.0) if self.clamp else out


def test_a_release_is_measured_as_its_mean_and_the_linear_map_of_its_draws():
    """The mechanisms' audits that draw their releases at once (DP-SGD, LoRM's Grams, client level) read the real
    call's mean and noise map: read exactly, and a release that is not affine in its draws (here clamped, as a
    diagonal Gram is after its noise) is refused rather than audited as the Gaussian it is not."""
    mean, columns = measured(Linear(), seed=0)
    torch.testing.assert_close(mean, Linear().mean, rtol=0, atol=0)
    torch.testing.assert_close(columns, Linear().map, rtol=0, atol=0)
    with pytest.raises(AssertionError, match="not affine in its draws"):
        measured(Linear(clamp=True), seed=0)


def test_neighbours_that_differ_where_no_noise_is_are_a_perfect_distinguisher():
    """A release whose third entry carries no noise (``A``'s last row is 0) must not let ``D`` and ``D'`` differ
    there: the auditor says so instead of scoring the covered entries only."""
    with pytest.raises(AssertionError, match="no noise covers"):
        affine("un-noised entry", 1.0, lambda row, source: Linear()(source) + row, sides(third=1.0), 1000)
    audit = affine("noised entries", 1.0, lambda row, source: Linear()(source) + row, sides(third=0.0), 1000)
    assert audit.mu == pytest.approx(math.sqrt(1 / 4 + 1 / 0.5), rel=1e-9)  # variances 4 and 0.5: A A^T


def sides(third: float) -> tuple[torch.Tensor, torch.Tensor]:
    """``D``'s and ``D'``'s offsets of :class:`Linear`'s release: ``D'`` moves each entry by 1 (the third by
    ``third``)."""
    return torch.zeros(3, dtype=torch.float64), torch.tensor([1.0, 1.0, third], dtype=torch.float64)
