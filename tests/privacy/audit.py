"""An empirical lower bound on a mechanism's epsilon from its releases (Jagielski, Ullman, Oprea 2020, "Auditing
differentially private machine learning"; Google's DP-Auditorium): the statistics any (epsilon, delta)-DP mechanism
must keep, checked on samples.

For neighbouring data sets ``D`` and ``D'`` and any set ``S`` of outputs, ``(epsilon, delta)``-DP says
``P(M(D') in S) <= e^epsilon P(M(D) in S) + delta`` and the same with ``D`` and ``D'`` swapped. Each release is
reduced to a scalar score (a projection on the direction in which ``D'`` moves the output, or the log-likelihood
ratio); ``S`` is a threshold set ``{score > t}`` (or ``{score <= t}``, the other direction), so a test that tells
``D'`` from ``D`` by ``score > t`` with false-positive rate ``FPR`` and false-negative rate ``FNR`` gives

``epsilon >= log((1 - delta - FNR) / FPR)``,

and so does each of the four tests a threshold makes (``S`` above or below it, saying ``D'`` or ``D`` on it: the
inequality in both directions). The rates are estimated from ``n`` releases of each side: every rate a test uses is
one of ``P_D`` and ``P_D'`` of ``score > t`` and of ``score <= t``, each replaced by its one-sided Clopper-Pearson
upper bound (exact binomial intervals) at ``alpha / (4 k)`` for ``k`` thresholds (Bonferroni), so that the maximum
over all of them is a lower bound on the true epsilon with confidence at least ``1 - alpha`` whatever threshold it
picks. The thresholds must not depend on the samples (the caller passes a
grid fixed in advance, e.g. in units of the stated noise's deviation), or the union bound would not hold.

How many samples: a threshold test cannot show more than about ``log(n / log(4 k / alpha))`` (no false positive at
all in ``n`` releases), and a Gaussian mechanism of ratio ``mu`` reaches ``epsilon`` only at ``t ~ epsilon / mu +
mu / 2`` deviations, where ``FPR`` is ``Q(t)``: :func:`samples_needed`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from scipy import stats

CONFIDENCE = 0.95  # of every bound this suite states


@dataclass(frozen=True)
class Bound:
    """An empirical lower bound on epsilon and the test that gave it."""

    epsilon: float  # -inf when no threshold gave any evidence (1 - delta - FNR <= 0 everywhere)
    threshold: float  # the score's threshold of the best test
    above: bool  # the best test's set S: score > threshold (True) or score <= threshold
    names_alt: bool  # it says D' on S (True: FPR = P_D(S)), or D (FPR = P_D'(S))
    false_positive: float  # the best test's FPR, its Clopper-Pearson upper bound
    false_negative: float  # its FNR, upper bound
    samples: int  # releases of each side
    confidence: float

    def __str__(self) -> str:
        test = f"says {'D' + chr(39) if self.names_alt else 'D'} on score {'>' if self.above else '<='} "
        return (
            f"eps_lb {self.epsilon:.3f} (n {self.samples:,} a side, {100 * self.confidence:g} % one-sided; "
            f"{test}{self.threshold:.3g}: FPR <= {self.false_positive:.3g}, FNR <= {self.false_negative:.3g})"
        )


def clopper_pearson_upper(events: np.ndarray, trials: int, alpha: float) -> np.ndarray:
    """The one-sided ``1 - alpha`` Clopper-Pearson upper bound on a binomial rate from ``events`` of ``trials``
    (vectorised): the ``1 - alpha`` quantile of ``Beta(k + 1, n - k)``, 1 where ``k = n``."""
    k = np.asarray(events, dtype=np.float64)
    safe = np.minimum(k, trials - 1)
    upper = stats.beta.ppf(1.0 - alpha, safe + 1, trials - safe)
    return np.where(k >= trials, 1.0, upper)


def epsilon_lower_bound(
    null: np.ndarray, alt: np.ndarray, delta: float, thresholds: np.ndarray, confidence: float = CONFIDENCE
) -> Bound:
    """The lower bound on epsilon at ``delta`` from the scores of releases on ``D`` (``null``, ``(n,)``) and on
    ``D'`` (``alt``, ``(n,)``, as many), over the threshold tests at ``thresholds`` in both directions (module
    docstring), with ``confidence`` jointly over all of them."""
    null, alt = np.sort(np.asarray(null, np.float64)), np.sort(np.asarray(alt, np.float64))
    if null.shape != alt.shape or null.ndim != 1 or not null.size:
        raise ValueError(f"expected as many scores of each side, got {null.shape} and {alt.shape}")
    n = null.size
    t = np.asarray(thresholds, np.float64)
    alpha = (1.0 - confidence) / (4 * t.size)  # Bonferroni: four rates a threshold
    null_below, alt_below = np.searchsorted(null, t, side="right"), np.searchsorted(alt, t, side="right")
    upper = {  # (side, above): the upper bound on P_side(score > t) or P_side(score <= t)
        (side, above): clopper_pearson_upper(count if not above else n - count, n, alpha)
        for side, count in (("null", null_below), ("alt", alt_below))
        for above in (True, False)
    }
    best = Bound(-math.inf, math.nan, True, True, 1.0, 1.0, n, confidence)
    for above in (True, False):
        for names_alt in (True, False):
            named, other = ("alt", "null") if names_alt else ("null", "alt")
            fpr, fnr = upper[(other, above)], upper[(named, not above)]
            power = 1.0 - delta - fnr
            with np.errstate(divide="ignore", invalid="ignore"):
                eps = np.where(power > 0, np.log(np.maximum(power, 1e-300) / fpr), -math.inf)
            i = int(np.argmax(eps))
            if eps[i] > best.epsilon:
                best = Bound(float(eps[i]), float(t[i]), above, names_alt, float(fpr[i]), float(fnr[i]), n, confidence)
    return best


def unit_thresholds(low: float = -2.0, high: float = 9.0, step: float = 0.1) -> np.ndarray:
    """A fixed grid of thresholds for a score in units of the noise's deviation (0 the mean under ``D``)."""
    return np.arange(low, high + step / 2, step)


def gaussian_bound(mu: float, delta: float, samples: int) -> float:
    """The bound the threshold tests give, in expectation, on a Gaussian mechanism of ratio ``mu`` with ``samples``
    releases a side: the best over :func:`unit_thresholds` of the bound at the expected counts (a planning figure,
    not a measurement)."""
    t = unit_thresholds()
    alpha = (1.0 - CONFIDENCE) / (4 * t.size)
    fp = np.round(samples * stats.norm.sf(t))
    fn = np.round(samples * stats.norm.cdf(t - mu))
    fpr, fnr = clopper_pearson_upper(fp, samples, alpha), clopper_pearson_upper(fn, samples, alpha)
    power = 1.0 - delta - fnr
    with np.errstate(divide="ignore", invalid="ignore"):
        eps = np.where(power > 0, np.log(np.maximum(power, 1e-300) / fpr), -math.inf)
    return float(eps.max())


def samples_needed(mu: float, delta: float, epsilon: float, start: int = 1000) -> int:
    """The least ``n`` (a power of 10 times 1, 2 or 5, from ``start``) at which :func:`gaussian_bound` of a Gaussian
    mechanism of ratio ``mu`` exceeds ``epsilon``: what an audit of a mechanism whose true ratio is ``mu`` needs to
    refute a stated ``epsilon``."""
    n = start
    while n < 10**9:
        for m in (1, 2, 5):
            if gaussian_bound(mu, delta, m * n) > epsilon:
                return m * n
        n *= 10
    raise ValueError(f"a Gaussian mechanism of ratio {mu:g} shows epsilon {epsilon:g} only beyond 10^9 releases")
