"""Distributed noise under secure aggregation (``dp.mode = distributed``): the Skellam mechanism's calibration, the
fixed point every party derives for it, and one client's share of a step's noise in the order its terms are masked.

**Who adds what.** Each of the ``n`` clients adds a symmetric Skellam share (``common/secagg/noise.py``) to its
encoded terms before masking: on the task's rows of the class sums variance ``V_S / t``, on the packed Gram's
diagonal ``V_G / t`` and off it ``V_G / (2 t)`` (the central mechanism's symmetric shape), ``t`` the SecAgg
threshold. Any ``|S| >= t`` survivors' sum carries ``|S| / t >= 1`` times ``V`` (``noise.carried_variance``); the
coordinator learns only that sum and adds nothing. Counts, the sample count and the loss sums stay un-noised:
public by design, as in central mode.

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

**The grid.** ``f`` (:func:`frac_bits`) is the most fractional bits at which a share of up to ``HEADROOM x`` the
Gaussian variance stays under ``GRID_CAP`` grid units (the sampler's limit, with room for the calibration's
``s``): the grid step is then about ``2^-20`` of the noise's deviation, and its rounding (the ``sqrt(m)`` terms)
costs nothing measurable. It depends on the settings and the number of clients alone, so client and coordinator
derive it alike, and its bound is widened by a share's tail (``noise.noisy_fixed_point``) so that an honest noisy
sum decodes.

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
    tail_bound,
)
from common.secagg.primitives import FixedPoint, SecAggError

GRID_CAP = 2.0**40  # a share's grid variance at most this (the sampler takes 2^41)
HEADROOM = 4.0  # f leaves room for a calibrated variance of up to 4 sigma^2
ORDERS = tuple(range(2, 257))  # the integer Renyi orders the Skellam bound holds at
GRAM_TERM, SUM_TERM = "sums/grams/gram/total@tril", "sums/plain/class_sum"  # a step's noised terms (packed)
PUBLIC_TERMS = ("sums/plain/class_count", "num_samples", "loss_sum", "loss_samples")  # never noised


def frac_bits(dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> int:
    """The fixed point's fractional bits of a distributed-DP run: the most ``f`` (at most ``secagg.frac_bits`` when
    set, and 64) with ``HEADROOM x`` the largest Gaussian share variance, ``sigma^2 / t``, under ``GRID_CAP`` in grid
    units (``sigma^2 4^f``)."""
    largest = max(r.sigma**2 for r in calibrate(dp, (GRAM, CLASS_SUM)).values()) / threshold
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
    """A run's distributed noise: the fixed point, the threshold, and per step shape the calibrated releases
    (``V = s sigma^2``); each client's share of a step (:meth:`share`) and what a sum of survivors carries."""

    def __init__(self, dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> None:
        self.dp, self.clients, self.threshold = dp, clients, threshold
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
        releases = self.layout_releases(entries)
        out = []
        for name, shape in entries:
            noise = np.zeros(shape, dtype=np.int64)
            if name == SUM_TERM:
                lo, hi = rows
                count = (hi - lo) * shape[-1]
                noise[lo:hi] = self._draw(releases[CLASS_SUM].variance, count, context, index, b"S").reshape(
                    hi - lo, shape[-1]
                )
            elif name == GRAM_TERM:
                d = int(round((math.sqrt(8 * shape[-1] + 1) - 1) / 2))
                r, c = torch.tril_indices(d, d)
                diagonal = (r == c).numpy()
                blocks = math.prod(shape[:-1])
                flat = noise.reshape(blocks, shape[-1])
                v = releases[GRAM].variance
                flat[:, diagonal] = self._draw(v, blocks * d, context, index, b"G=").reshape(blocks, d)
                flat[:, ~diagonal] = self._draw(v / 2, blocks * (shape[-1] - d), context, index, b"G<").reshape(
                    blocks, -1
                )
            out.append(noise.reshape(-1))
        return np.concatenate(out)

    def _draw(self, variance: float, count: int, context: bytes, index: int, what: bytes) -> np.ndarray:
        """``count`` Skellam entries of a share of ``variance`` (real units, the sum's over ``t``): from the CSPRNG,
        or with ``dp.seed >= 0`` from a key of the seed, the step, the client and ``what``."""
        seed = None
        if self.dp.seed >= 0:
            seed = hashlib.sha256(b"|".join([b"dp-share", str(self.dp.seed).encode(), context, b"%d" % index, what]))
        v = share_variance(variance, self.clients, self.threshold)
        return skellam(grid_variance(v, self.fp), count, seed=None if seed is None else seed.digest())

    def carried(self, survivors: int) -> float:
        """What a sum of ``survivors`` carries, as a multiple of ``V``: ``|S| / t`` (at least 1)."""
        return carried_variance(1.0, self.clients, self.threshold, survivors)

    def gram_slack(self, entries: tuple[tuple[str, tuple[int, ...]], ...], survivors: int) -> float:
        """A bound on the spectral norm of the summed noise on a Gram block: every entry of each share within
        ``share_tail`` grid units, so ``|E|_2 <= |E|_F <= d survivors share_tail 2^-f`` (the coordinator's check
        that the noisy sum is positive semidefinite up to this)."""
        shapes = dict(entries)
        if GRAM_TERM not in shapes:
            return 0.0
        d = int(round((math.sqrt(8 * shapes[GRAM_TERM][-1] + 1) - 1) / 2))
        return d * survivors * self.share_tail * 2.0**-self.fp.frac_bits

    def report(self, releases: dict[str, SkellamRelease], survivors: int) -> dict[str, Any]:
        """What a step of ``survivors`` carried: per statistic the variance ``|S| V / t`` of its (diagonal) entries,
        and the epsilon at ``dp.delta`` of that sum (at most the budget)."""
        carried = self.carried(survivors)
        return {
            "variance": {name: carried * r.variance for name, r in releases.items()},
            "epsilon": epsilon(releases, self.fp, self.dp.delta, carried),
            "survivors": survivors,
            "threshold": self.threshold,
            "frac_bits": self.fp.frac_bits,
        }
