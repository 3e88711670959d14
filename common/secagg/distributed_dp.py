"""Distributed noise under secure aggregation (``dp.mode = distributed``): the Skellam mechanism's calibration, the
fixed point every party derives for it, and one client's share of a step's noise in the order its terms are masked.

**Who adds what.** Each of the ``n`` clients adds a symmetric Skellam share (``common/secagg/noise.py``) to its
encoded terms before masking: on the task's rows of the class sums variance ``V_S / (t - k)``, on the packed Gram's
diagonal ``V_G / (t - k)`` and off it ``V_G / (2 (t - k))`` (the central mechanism's symmetric shape), ``t`` the
SecAgg threshold and ``k`` (``dp.colluders``, below ``t``) the clients that may collude with the coordinator: they
know their own shares and can subtract them. Any ``|S| >= t`` survivors' sum, the colluders' shares taken out,
carries ``(|S| - k) / (t - k) >= 1`` times ``V`` (``noise.carried_variance``); the coordinator learns only that sum
and adds nothing. Counts, the sample count and the loss sums stay un-noised: public by design, as in central mode.

**The guarantee.** The sum is a Skellam mechanism on the integer query ``rint(x 2^f)``; its Renyi DP at integer
orders ``alpha`` (Agarwal, Kairouz, Liu 2021, Corollary 3.6; ``noise.skellam_rdp``), with sensitivities in grid
units that include the rounding (``noise.grid_sensitivity``: ``+ sqrt(m)`` in L2, ``m`` the entries one record
changes), is

``eps(alpha) = alpha L2w^2 / (2 V) + min((2 alpha L2^2 + 6 L1) / (4 V_min^2), 3 L1 / (2 V_min))``

(``2 alpha``: the larger of the corollary's two readings, as ``common.secagg.noise.skellam_rdp``)

per statistic, summed over the statistics (independent noise: Renyi DP adds). ``L2w`` is the L2 sensitivity in
the coordinates that make the Gram's noise isotropic (off-diagonal entries times ``sqrt 2``: ``C^2 2^f + d
sqrt(K)`` for ``K`` blocks of width ``d``), ``L2``, ``L1`` the plain ones of the packed entries, ``V_min`` the
least variance of an entry (``V_G / 2`` off the Gram's diagonal): each term only grows as a variance shrinks, so
the sum bounds the per-entry mechanism's. ``dp_accounting``'s RDP conversion (``compute_epsilon``) turns it into
``(epsilon, delta)``. Calibration: ``V = s sigma^2`` per statistic, ``sigma`` the central Gaussian calibration's,
with the least ``s >= 1`` (bisection) whose ``epsilon`` at ``V`` meets the budget; the RDP conversion is looser than
the analytic Gaussian's, so ``s`` is a little above 1 (1.2 at ``epsilon`` 0.5, 1.13 at 8).

**The sampler's term in delta.** The shares come from a float64 sampler whose law differs from the exact Skellam's
by at most ``noise.skellam_tv`` per entry; over every noised entry of every share the sum holds, that is ``TV``
(:meth:`DistributedNoise.tv`), and the exact mechanism's ``(epsilon, delta)`` holds for the sampled one at
``(epsilon, delta + (1 + e^epsilon) TV)`` (at most 1: a ``delta`` of 1 promises nothing). Each step states that
``delta`` beside the accountant's, rather than calibrating the accountant's ``delta`` down to make room for the term:
``TV`` does not shrink with more noise (it grows as the noise's deviation, through the Poisson means), so no variance
would absorb it, and at a head's usual widths it is by far the larger term (``TV`` 2e-3 over three shares at ``F' =
1,152``, a Gram's 664,000 entries each: ``delta`` 7e-3 at ``epsilon`` 1, and past 1 at 8), which would refuse every
such run where stating it leaves the figure in view. The levers are the sampler's precision (an exact integer
sampler) and the number of noised entries, not the noise.

**The grid.** ``f`` (:func:`frac_bits`) is the most fractional bits at which a share (``/ (t - k)``) of up to
``HEADROOM x`` the Gaussian variance stays under ``GRID_CAP`` grid units (the sampler's limit, with room for the
calibration's ``s``): the grid step is then about ``2^-20`` of the noise's deviation, and its rounding (the
``sqrt(m)`` terms) costs nothing measurable. It depends on the settings and the number of clients alone, so client
and coordinator derive it alike, and its bound is widened by a share's tail (``noise.noisy_fixed_point``) so that an
honest noisy sum decodes.

**Seeds.** ``dp.seed = -1``: each share from a fresh ChaCha20 key of the OS CSPRNG. ``dp.seed >= 0`` (tests and
reproducible comparisons only): the key is SHA-256 of the seed, the step's context (run, task, round, phase,
SecAgg attempt), the client's index and the statistic, so no two shares ever share a stream.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from common.privacy.gaussian import CLASS_SUM, GRAM, calibrate
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.noise import (
    MAX_COUNT,
    carried_variance,
    grid_sensitivity,
    grid_variance,
    noisy_fixed_point,
    share_variance,
    skellam,
    skellam_tv,
    tail_bound,
)
from common.secagg.primitives import FixedPoint, SecAggError

GRID_CAP = 2.0**40  # a share's grid variance at most this (the sampler takes 2^41)
HEADROOM = 4.0  # f leaves room for a calibrated variance of up to 4 sigma^2
ORDERS = tuple(range(2, 257))  # the integer Renyi orders the Skellam bound holds at
GRAM_TERM, SUM_TERM = "sums/grams/gram/total@tril", "sums/plain/class_sum"  # a step's noised terms (packed)
PUBLIC_TERMS = ("sums/plain/class_count", "num_samples", "loss_sum", "loss_samples")  # never noised
Draw = tuple[float, int]  # one stream of a share: the sum's variance V (real units) and its entries


def noised_entries(gram_shape: tuple[int, ...], class_sums: tuple[int, ...]) -> tuple[tuple[str, tuple[int, ...]], ...]:
    """The noised terms of a head's step as its masked layout names them (``Layout.entries``): the Gram of
    ``gram_shape`` (``(d, d)`` or ``(K, d, d)``; ``()``: none) packed to ``(..., d(d+1)/2)``, the class sums of
    ``class_sums`` ``(C, width)``."""
    if not gram_shape:
        return ((SUM_TERM, class_sums),)
    d = gram_shape[-1]
    return ((GRAM_TERM, (*gram_shape[:-2], d * (d + 1) // 2)), (SUM_TERM, class_sums))


def honest_threshold(dp: DpSettings, threshold: int) -> int:
    """``t - k``: the honest shares any ``t`` survivors hold when ``k = dp.colluders`` collude with the coordinator;
    ``SecAggError`` naming ``dp.colluders`` unless ``k < t`` (else a sum of ``t`` could hold no honest share)."""
    if not 0 <= dp.colluders < threshold:
        raise SecAggError(
            f"dp.colluders={dp.colluders} must lie in [0, {threshold}): below the secure aggregation threshold "
            f"{threshold}, or a sum of {threshold} survivors could hold no honest share"
        )
    return threshold - dp.colluders


def frac_bits(dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> int:
    """The fixed point's fractional bits of a distributed-DP run: the most ``f`` (at most ``secagg.frac_bits`` when
    set, and 64) with ``HEADROOM x`` the largest Gaussian share variance, ``sigma^2 / (t - k)``, under ``GRID_CAP``
    in grid units (``sigma^2 4^f``)."""
    gaussian = calibrate(dp, (GRAM, CLASS_SUM))
    largest = max(r.sigma**2 for r in gaussian.values()) / honest_threshold(dp, threshold)
    f = math.floor((math.log2(GRID_CAP) - math.log2(HEADROOM * largest)) / 2)
    if f < 0:
        raise SecAggError(f"dp.mode = distributed: a share variance of {largest:g} exceeds the Skellam sampler's grid")
    return min(f, secagg.frac_bits or 64)


def dp_fixed_point(dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> FixedPoint:
    """The encoding of a distributed-DP run: :func:`frac_bits`, ``secagg.bound`` widened by the tail of a share of
    the largest variance :func:`frac_bits` allows (over ``MAX_COUNT`` entries): client and coordinator alike."""
    f = frac_bits(dp, secagg, clients, threshold)
    fp = noisy_fixed_point(FixedPoint(frac_bits=f, bound=secagg.bound), tail_bound(GRID_CAP, MAX_COUNT))
    fp.check(clients)
    return fp


@dataclass(frozen=True)
class SkellamRelease:
    """One statistic's Skellam mechanism: its L2 sensitivity in real units, the variance ``V`` its diagonal (or
    every) entry carries at least, and its shape on the grid: ``entries`` a record can change, ``isotropic`` the
    L2 norm of a unit rounding error in the noise-isotropic coordinates, ``least`` the least entry variance over
    ``V``."""

    sensitivity: float
    variance: float
    entries: int
    isotropic: float
    least: float

    def rdp(self, order: int, fp: FixedPoint, scale: float = 1.0) -> float:
        """``eps(alpha)`` (module docstring) when the sum carries ``scale x V``."""
        v = grid_variance(self.variance * scale, fp)
        least = v * self.least
        l2, l1 = grid_sensitivity(self.sensitivity, self.entries, fp)
        l2w = self.sensitivity * 2.0**fp.frac_bits + self.isotropic
        lattice = min((2 * order * l2**2 + 6 * l1) / (4 * least**2), 3 * l1 / (2 * least))
        return order * l2w**2 / (2 * v) + lattice


def releases_of(
    dp: DpSettings, statistics: tuple[str, ...], gram_shape: tuple[int, ...], width: int, scale: float
) -> dict[str, SkellamRelease]:
    """The step's Skellam releases at ``scale x`` the Gaussian calibration's variances: the Gram of
    ``gram_shape`` (``(d, d)`` or ``(K, d, d)``) when ``statistics`` hold it, and a class sum's row of ``width``."""
    gaussian = calibrate(dp, statistics)
    out = {
        CLASS_SUM: SkellamRelease(
            gaussian[CLASS_SUM].sensitivity, scale * gaussian[CLASS_SUM].sigma ** 2, width, math.sqrt(width), 1.0
        )
    }
    if GRAM in gaussian:
        d, blocks = gram_shape[-1], math.prod(gram_shape[:-2])
        out[GRAM] = SkellamRelease(
            gaussian[GRAM].sensitivity,
            scale * gaussian[GRAM].sigma ** 2,
            blocks * d * (d + 1) // 2,
            d * math.sqrt(blocks),
            0.5,
        )
    return out


def epsilon(releases: dict[str, SkellamRelease], fp: FixedPoint, delta: float, scale: float = 1.0) -> float:
    """The ``epsilon`` at ``delta`` of the releases together when the sum carries ``scale x`` their variances
    (``dp_accounting``'s conversion of the summed Renyi DP)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = [sum(r.rdp(order, fp, scale) for r in releases.values()) for order in ORDERS]
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


def calibrate_scale(releases: dict[str, SkellamRelease], fp: FixedPoint, dp: DpSettings) -> float:
    """The least ``s`` in ``[1, HEADROOM]`` (to ``1e-6``) at which the releases meet ``(dp.epsilon, dp.delta)``."""
    if epsilon(releases, fp, dp.delta, HEADROOM) > dp.epsilon:
        raise SecAggError(
            f"dp.mode = distributed: even {HEADROOM:g} x the Gaussian variance misses epsilon {dp.epsilon:g} on a "
            f"grid of 2^-{fp.frac_bits}"
        )
    if epsilon(releases, fp, dp.delta) <= dp.epsilon:
        return 1.0
    low, high = 1.0, HEADROOM
    while high - low > 1e-6:
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(releases, fp, dp.delta, mid) > dp.epsilon else (low, mid)
    return high


class DistributedNoise:
    """A run's distributed noise: the fixed point, the threshold, the colluders ``k = dp.colluders``, and per step
    shape the calibrated releases (``V = s sigma^2``); each client's share of a step (:meth:`share`), what a sum of
    survivors carries against the coordinator and ``k`` colluders (:meth:`carried`) and the sampler's term in
    ``delta`` (:meth:`tv`)."""

    def __init__(self, dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> None:
        self.dp, self.clients, self.threshold, self.colluders = dp, clients, threshold, dp.colluders
        self.fp = dp_fixed_point(dp, secagg, clients, threshold)
        self.share_tail = tail_bound(GRID_CAP, MAX_COUNT)  # the widening of fp's bound
        self._calibrated: dict[tuple, dict[str, SkellamRelease]] = {}

    def releases(
        self, statistics: tuple[str, ...], gram_shape: tuple[int, ...], width: int
    ) -> dict[str, SkellamRelease]:
        """The releases of a step whose Gram is ``gram_shape`` (``()``: none) and class sums' rows ``width`` wide,
        calibrated to the budget (cached: one bisection per shape)."""
        key = (statistics, gram_shape, width)
        if key not in self._calibrated:
            unit = releases_of(self.dp, statistics, gram_shape, width, 1.0)
            s = calibrate_scale(unit, self.fp, self.dp)
            self._calibrated[key] = releases_of(self.dp, statistics, gram_shape, width, s)
        return self._calibrated[key]

    def layout_releases(self, entries: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, SkellamRelease]:
        """The releases of a step from its masked layout (``Layout.entries``): the packed Gram's and class sums'
        shapes. ``SecAggError`` for a term no release covers and that is not public: it would leave un-noised."""
        shapes = dict(entries)
        stray = sorted(set(shapes) - {GRAM_TERM, SUM_TERM, *PUBLIC_TERMS})
        if stray or SUM_TERM not in shapes:
            raise SecAggError(f"dp.mode = distributed: no noise is calibrated for the terms {stray or [SUM_TERM]}")
        gram_shape: tuple[int, ...] = ()
        if GRAM_TERM in shapes:
            *blocks, packed = shapes[GRAM_TERM]
            d = int(round((math.sqrt(8 * packed + 1) - 1) / 2))
            gram_shape = (*blocks, d, d)
        statistics = (GRAM, CLASS_SUM) if gram_shape else (CLASS_SUM,)
        return self.releases(statistics, gram_shape, shapes[SUM_TERM][-1])

    def share(
        self, entries: tuple[tuple[str, tuple[int, ...]], ...], rows: tuple[int, int], context: bytes, index: int
    ) -> np.ndarray:
        """Client ``index``'s share of the step's noise, ``(size,)`` int64 grid units in the layout's order: the
        class sums' ``rows`` (the task's) at ``V_S / t``, the packed Gram's diagonal at ``V_G / t`` and the rest of
        it at ``V_G / (2 t)``, nothing on the public terms. ``context``: the step's (``terms.context``)."""
        draws = self.draws(entries, rows)
        out = []
        for name, shape in entries:
            noise = np.zeros(shape, dtype=np.int64)
            if name == SUM_TERM:
                lo, hi = rows
                noise[lo:hi] = self._draw(*draws[b"S"], context, index, b"S").reshape(hi - lo, shape[-1])
            elif name == GRAM_TERM:
                d = int(round((math.sqrt(8 * shape[-1] + 1) - 1) / 2))
                r, c = torch.tril_indices(d, d)
                diagonal = (r == c).numpy()
                flat = noise.reshape(math.prod(shape[:-1]), shape[-1])
                flat[:, diagonal] = self._draw(*draws[b"G="], context, index, b"G=").reshape(len(flat), d)
                flat[:, ~diagonal] = self._draw(*draws[b"G<"], context, index, b"G<").reshape(len(flat), -1)
            out.append(noise.reshape(-1))
        return np.concatenate(out)

    def draws(self, entries: tuple[tuple[str, tuple[int, ...]], ...], rows: tuple[int, int]) -> dict[bytes, Draw]:
        """What one share of a step draws, by stream: ``(V, count)``, the variance of the sum (real units; a share
        draws ``V / (t - k)``) and the entries: the class sums' ``rows`` (``S``), the packed Gram's diagonal
        (``G=``) and the rest of it (``G<``, at ``V_G / 2``)."""
        releases = self.layout_releases(entries)
        shapes = dict(entries)
        lo, hi = rows
        out = {b"S": (releases[CLASS_SUM].variance, (hi - lo) * shapes[SUM_TERM][-1])}
        if GRAM_TERM in shapes:
            *blocks, packed = shapes[GRAM_TERM]
            d = int(round((math.sqrt(8 * packed + 1) - 1) / 2))
            out[b"G="] = (releases[GRAM].variance, math.prod(blocks) * d)
            out[b"G<"] = (releases[GRAM].variance / 2, math.prod(blocks) * (packed - d))
        return out

    def share_grid_variance(self, variance: float) -> float:
        """A share's variance in grid units for a sum of ``variance`` (real units): ``V / (t - k) 4^f``."""
        return grid_variance(share_variance(variance, self.clients, self.threshold, colluders=self.colluders), self.fp)

    def tv(self, draws: dict[bytes, Draw], shares: int) -> float:
        """``TV``: the bound on the total variation between the sampled and the exact law of ``shares`` shares that
        each draw ``draws`` (:meth:`draws`), every entry's ``noise.skellam_tv`` added (independent draws)."""
        one = sum(count * skellam_tv(self.share_grid_variance(v)) for v, count in draws.values())
        return shares * one

    def _draw(self, variance: float, count: int, context: bytes, index: int, what: bytes) -> np.ndarray:
        """``count`` Skellam entries of a share for a sum of ``variance`` (real units; the share's is over ``t - k``):
        from the CSPRNG, or with ``dp.seed >= 0`` from a key of the seed, the step, the client and ``what``."""
        seed = None
        if self.dp.seed >= 0:
            seed = hashlib.sha256(b"|".join([b"dp-share", str(self.dp.seed).encode(), context, b"%d" % index, what]))
        return skellam(self.share_grid_variance(variance), count, seed=None if seed is None else seed.digest())

    def carried(self, survivors: int) -> float:
        """What a sum of ``survivors`` carries against the coordinator and ``k`` colluders, as a multiple of ``V``:
        ``(|S| - k) / (t - k)`` (at least 1)."""
        return carried_variance(1.0, self.clients, self.threshold, survivors, colluders=self.colluders)

    def gram_slack(self, entries: tuple[tuple[str, tuple[int, ...]], ...], survivors: int) -> float:
        """A bound on the spectral norm of the summed noise on a Gram block: every entry of each share within
        ``share_tail`` grid units, so ``|E|_2 <= |E|_F <= d survivors share_tail 2^-f`` (the coordinator's check
        that the noisy sum is positive semidefinite up to this)."""
        shapes = dict(entries)
        if GRAM_TERM not in shapes:
            return 0.0
        d = int(round((math.sqrt(8 * shapes[GRAM_TERM][-1] + 1) - 1) / 2))
        return d * survivors * self.share_tail * 2.0**-self.fp.frac_bits

    def report(self, releases: dict[str, SkellamRelease], survivors: int, draws: dict[bytes, Draw]) -> dict[str, Any]:
        """What a step of ``survivors`` carried against the coordinator and ``k`` colluders: per statistic the
        variance ``(|S| - k) V / (t - k)`` of its (diagonal) entries, the epsilon at ``dp.delta`` of that sum (at
        most the budget), the sampler's ``tv`` over the ``|S|`` shares that drew ``draws`` (the colluders' counted
        too: an upper bound) and the ``delta`` it makes, ``dp.delta + (1 + e^epsilon) tv``, at most 1 (module
        docstring)."""
        carried = self.carried(survivors)
        eps = epsilon(releases, self.fp, self.dp.delta, carried)
        tv = self.tv(draws, survivors)
        return {
            "variance": {name: carried * r.variance for name, r in releases.items()},
            "epsilon": eps,
            "survivors": survivors,
            "colluders": self.colluders,
            "threshold": self.threshold,
            "frac_bits": self.fp.frac_bits,
            "tv": tv,
            "delta_accountant": self.dp.delta,
            "delta": min(1.0, self.dp.delta + (1 + math.exp(eps)) * tv),
        }
