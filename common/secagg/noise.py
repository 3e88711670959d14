"""Distributed noise for secure aggregation: each client's discrete Gaussian share, so that the survivors' sum is
private.

**The mechanism.** Client ``i`` adds an integer noise vector ``e_i`` to its encoded values before masking:
``y_i = encode(x_i) + e_i + masks``. The coordinator learns only ``sum_{i in S} (encode(x_i) + e_i)`` over the
survivors ``S``: it never sees a term with less noise than the sum's. Each ``e_i`` is discrete Gaussian,
``N_Z(0, sigma^2)`` per entry with an integer ``sigma^2`` (:func:`share_grid_variance`), drawn by an exact sampler
(``common/secagg/discrete_gaussian.py``: integer arithmetic only, so the sampled law *is* the stated one and no
sampler term enters ``delta``). Discrete Gaussians are not closed under sums: ``n`` shares sum to a law close to
``N_Z(0, n sigma^2)``, and Kairouz, Liu, Steinke 2021 ("The Distributed Discrete Gaussian Mechanism for Federated
Learning with Secure Aggregation", ICML; Theorem 1, in Renyi form their Proposition 14) bound the difference by
``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``: :func:`distributed_rdp`, :func:`log_tau`. At a
share's ``sigma^2`` of ``2^37`` grid units ``log tau`` is about ``-pi^2 sigma^2 = -1.4e12``: ``tau`` underflows
float64 to 0 and the sum is private as the discrete Gaussian of ``n sigma^2`` is, to float64's precision.

**The grid.** Noise and values live on the grid of :class:`FixedPoint`: integers in units of ``2^-f``,
which the ring ``Z_2^128`` adds exactly, so the decoded sum is the exact integer sum (nothing rounds
after noising). The mechanism is private for the *integer* query ``rint(x 2^f)``: if one record moves a
client's values by ``||x - x'||_2 <= Delta``, the rounded vectors differ by at most ``Delta 2^f + sqrt(m)``
in L2 and ``sqrt(m) Delta 2^f + m`` in L1, ``m`` the entries one record can change (each entry's two
roundings add at most 1; entries a record cannot change round alike): :func:`grid_sensitivity`. A
variance ``sigma^2`` in real units is ``sigma^2 4^f`` in grid units (:func:`grid_variance`). Noise on a
coarser grid than the values would not do: the outputs of neighbours would have disjoint supports.

**Dropped clients.** Shares are drawn before anyone knows who survives, so each of ``n`` clients adds
``v = sigma^2 / t``, ``t`` the SecAgg threshold, the fewest survivors a step accepts: any ``|S| >= t``
carries ``|S| sigma^2 / t >= sigma^2`` (:func:`share_variance`, :func:`carried_variance`). The price: up to
``n / t`` times the needed variance when everyone survives (twice, with the default majority threshold).
The accountant must use the variance the sum carries, which it can only bound below by ``sigma^2``
before the step and know exactly (``|S| v``) after it. Clients that collude with the coordinator know their
own shares and can take them out: against ``c`` of them the shares are ``sigma^2 / (t - c)``. On the grid a
share's parameter is rounded *up* to an integer (:func:`share_grid_variance`), so that every bound stated with
the real ``v`` holds.

**Overflow.** The discrete Gaussian is unbounded; :func:`tail_bound` gives a magnitude that ``count`` entries
exceed with probability at most ``failure`` (sub-Gaussian: ``P(|Z| >= a) <= 2 exp(-a^2 / (2 sigma^2))``, since
its moment generating function is at most the continuous Gaussian's, ``exp(s^2 sigma^2 / 2)``; Canonne, Kamath,
Steinke 2020). :func:`noisy_fixed_point` widens a :class:`FixedPoint`'s bound by one share's tail, so that
``check`` and ``decode`` hold for noisy terms, and :func:`add_noise` refuses a share beyond it (never clips it:
clipping would change the noise's law).
"""

from __future__ import annotations

import math
from fractions import Fraction

import numpy as np

from common.secagg.discrete_gaussian import MAX_VARIANCE, discrete_gaussian
from common.secagg.primitives import FixedPoint, SecAggError, ring_add

DEFAULT_FAILURE = 2.0**-64  # the probability that a share exceeds its tail bound (then refused, not clipped)


# ------------------------------------------------------------------------- variances and sensitivity


def share_variance(variance: float, clients: int, threshold: int, *, colluders: int = 0) -> float:
    """Each client's share ``v = sigma^2 / (t - c)``: any ``t`` or more of the ``n`` clients carry at least
    ``sigma^2`` even after ``c`` of them (``colluders``, who know their own shares) take theirs out."""
    if not (math.isfinite(variance) and variance >= 0):
        raise SecAggError(f"noise: expected a finite variance >= 0, got {variance}")
    if not 1 <= threshold <= clients:
        raise SecAggError(f"noise: expected a threshold in [1, {clients}] for {clients} clients, got {threshold}")
    if not 0 <= colluders < threshold:
        raise SecAggError(f"noise: expected fewer colluders than the threshold {threshold}, got {colluders}")
    return variance / (threshold - colluders)


def carried_variance(variance: float, clients: int, threshold: int, survivors: int, *, colluders: int = 0) -> float:
    """The variance of the survivors' sum that the coordinator and ``c`` colluding clients cannot remove:
    ``(|S| - c) v`` with ``v`` of :func:`share_variance`; ``>= sigma^2``, and ``(n - c) / (t - c)`` times it at most.

    ``SecAggError`` for a survivor count the step cannot have (below ``t``: the step fails; above ``n``)."""
    if not threshold <= survivors <= clients:
        raise SecAggError(
            f"noise: expected between the threshold {threshold} and the {clients} clients as survivors, got {survivors}"
        )
    return (survivors - colluders) * share_variance(variance, clients, threshold, colluders=colluders)


def grid_variance(variance: float, fp: FixedPoint) -> float:
    """``sigma^2`` in real units as grid units: ``sigma^2 4^f`` (a grid step is ``2^-f``)."""
    return variance * 4.0**fp.frac_bits


def share_grid_variance(variance: float, fp: FixedPoint, clients: int, threshold: int, *, colluders: int = 0) -> int:
    """A share's discrete Gaussian parameter in grid units, an integer: ``ceil(sigma^2 4^f / (t - c))`` computed
    exactly (the float ``variance`` as the rational it is), at least the real share's, so bounds stated with
    :func:`share_variance` hold. ``SecAggError`` beyond the sampler's ``2^60``."""
    share_variance(variance, clients, threshold, colluders=colluders)  # its checks
    grid = math.ceil(Fraction(variance) * 4**fp.frac_bits / (threshold - colluders))
    if grid > MAX_VARIANCE:
        raise SecAggError(f"noise: a share variance of {float(grid):g} grid units exceeds the sampler's 2^60")
    return grid


def grid_sensitivity(l2: float, entries: int, fp: FixedPoint) -> tuple[float, float]:
    """``(L2, L1)`` sensitivity in grid units of the rounded values ``rint(x 2^f)``.

    ``l2``: how far one record moves a client's real values (``||x - x'||_2``); ``entries``: how many
    entries one record can change (``m``). ``L2 <= l2 2^f + sqrt(m)``, ``L1 <= sqrt(m) l2 2^f + m``:
    ``rint(a) - rint(b) = (a - b) + (r_a - r_b)`` with ``|r_a - r_b| <= 1`` where ``a != b`` and ``0`` elsewhere."""
    if not (math.isfinite(l2) and l2 >= 0 and entries >= 1):
        raise SecAggError(f"noise: expected a finite l2 >= 0 and entries >= 1, got l2 {l2}, entries {entries}")
    scaled = l2 * 2.0**fp.frac_bits
    return scaled + math.sqrt(entries), math.sqrt(entries) * scaled + entries


# ------------------------------------------------------------------------- the sum's Renyi DP


def log_tau(share: float, shares: int) -> float:
    """``log tau``, ``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))`` for ``n = shares`` shares of
    parameter ``sigma^2 = share`` (grid units), in log space (log-sum-exp); ``-inf`` for one share (``tau = 0``).
    ``SecAggError`` for ``sigma < 1/2`` with several shares (the theorem's condition): a finer grid raises it."""
    if shares < 1:
        raise SecAggError(f"noise: expected at least one share, got {shares}")
    if shares == 1:
        return -math.inf
    if not share >= 0.25:
        raise SecAggError(
            f"noise: expected a share variance of at least 1/4 grid units (sigma >= 1/2), got {share}: "
            "more fractional bits (secagg.frac_bits) raise it"
        )
    exponents = [-2 * math.pi**2 * share * k / (k + 1) for k in range(1, shares)]
    top = max(exponents)
    return math.log(10) + top + math.log(sum(math.exp(e - top) for e in exponents))


def distributed_rdp(
    order: float, l1: float, l2: float, variance: float, shares: int, entries: int, *, least: float | None = None
) -> float:
    """The Renyi DP at ``order`` ``alpha >= 1`` of ``n = shares`` independent discrete Gaussian shares summed on an
    integer query (Kairouz, Liu, Steinke 2021, Proposition 14, applied entry by entry and added: the entries'
    noises are independent):

    ``eps(alpha) = min(alpha L2^2 / (2 V) + tau m, alpha / 2 (L2^2 / V + 2 tau L1 / sqrt(V_min) + tau^2 m),
    alpha / 2 (L2 / sqrt(V) + tau sqrt(m))^2)``

    ``V = n sigma^2`` the sum's parameter on the entries whose noise it measures ``L2`` in (grid units), ``V_min``
    (``least``; default ``V``) the least entry's, ``L1`` plain, ``m = entries`` the entries one record can change
    (the others' laws are equal), ``tau`` of :func:`log_tau` at the least share ``V_min / n`` (``tau`` only grows as
    ``sigma`` shrinks). With one share ``tau = 0``: the discrete Gaussian's ``alpha L2^2 / (2 V)`` (CKS 2020)."""
    least = variance if least is None else least
    if not (order >= 1 and 0 < least <= variance and l1 >= 0 and l2 >= 0 and entries >= 1):
        raise SecAggError(
            f"noise: expected an order >= 1, 0 < least <= variance, l1, l2 >= 0, entries >= 1, got {order}, "
            f"{least}, {variance}, {l1}, {l2}, {entries}"
        )
    tau = math.exp(log_tau(least / shares, shares))  # 0.0 once it underflows (module docstring)
    return min(
        order * l2**2 / (2 * variance) + tau * entries,
        order / 2 * (l2**2 / variance + 2 * tau * l1 / math.sqrt(least) + tau**2 * entries),
        order / 2 * (l2 / math.sqrt(variance) + tau * math.sqrt(entries)) ** 2,
    )


# ------------------------------------------------------------------------- one client's share


def noise_share(
    count: int,
    variance: float,
    fp: FixedPoint,
    clients: int,
    threshold: int,
    *,
    colluders: int = 0,
    seed: bytes | None = None,
) -> np.ndarray:
    """One client's share for a sum that must carry ``variance`` (real units) whenever ``threshold`` of the
    ``clients`` survive (less ``colluders``): ``N_Z(0, share_grid_variance(...))``, ``(count,)`` int64 in grid
    units."""
    share = share_grid_variance(variance, fp, clients, threshold, colluders=colluders)
    return discrete_gaussian(share, count, seed=seed)


# ------------------------------------------------------------------------- the ring and its headroom


def tail_bound(variance: float, count: int, failure: float = DEFAULT_FAILURE) -> int:
    """An integer ``a`` with ``P(max_j |Z_j| > a) <= failure`` for ``count`` entries ``Z_j ~ N_Z(0, variance)``:
    ``a = ceil(sqrt(2 variance log(2 count / failure)))``, from ``P(|Z| >= a) <= 2 exp(-a^2 / (2 variance))``
    (module docstring) and a union bound."""
    if not (variance >= 0 and count >= 1 and 0 < failure < 1):
        raise SecAggError(
            f"noise: expected variance >= 0, count >= 1, 0 < failure < 1, got {variance}, {count}, {failure}"
        )
    return math.ceil(math.sqrt(2 * variance * math.log(2 * count / failure)))


def noisy_fixed_point(fp: FixedPoint, share_tail: int) -> FixedPoint:
    """``fp`` with its bound widened by one share's tail (grid units): a noisy term ``x + e_i 2^-f`` lies within
    it, so :meth:`FixedPoint.check` and :func:`decode` with it hold for the survivors' noisy sum."""
    return FixedPoint(frac_bits=fp.frac_bits, bound=fp.bound + share_tail * 2.0**-fp.frac_bits)


def to_ring(noise: np.ndarray) -> np.ndarray:
    """int64 grid integers as ring elements ``(count, 2)``: two's complement, the high limb all ones where negative."""
    noise = np.asarray(noise, dtype=np.int64).reshape(-1)
    high = np.where(noise < 0, np.uint64(2**64 - 1), np.uint64(0))
    return np.stack([noise.view(np.uint64), high], axis=1)


def add_noise(encoded: np.ndarray, noise: np.ndarray, share_tail: int) -> np.ndarray:
    """``encode(x) + e_i`` on the ring, ``(count, 2)``; ``SecAggError`` if a share entry exceeds ``share_tail`` (an
    event of probability ``failure``: refused, not clipped, since clipping would change the noise's law)."""
    noise = np.asarray(noise, dtype=np.int64).reshape(-1)
    if noise.shape[0] != len(encoded):
        raise SecAggError(f"noise: expected {len(encoded)} noise entries for the encoded values, got {noise.shape[0]}")
    if noise.size and int(np.abs(noise).max()) > share_tail:
        raise SecAggError(
            f"noise: a share entry of magnitude {int(np.abs(noise).max())} exceeds its tail bound {share_tail}: "
            "the client sits this step out (a dropped client); a redrawn share would follow a truncated law"
        )
    return ring_add(np.asarray(encoded, dtype=np.uint64).reshape(-1, 2), to_ring(noise))
