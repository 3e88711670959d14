"""Distributed noise under secure aggregation (``dp.mode = distributed``): the distributed discrete Gaussian's
calibration, the fixed point every party derives for it, and one client's share of a step's noise in the order its
terms are masked.

**Who adds what.** Each of the ``n`` clients adds a discrete Gaussian share (``common/secagg/noise.py``, drawn by the
exact sampler of ``common/secagg/discrete_gaussian.py``) to its encoded terms before masking: on the task's rows of
the class sums parameter ``V_S / (t - k)``, on the packed Gram's diagonal ``V_G / (t - k)`` and off it ``V_G / (2 (t -
k))`` (the central mechanism's symmetric shape), each rounded up to an integer on the grid, ``t`` the SecAgg threshold
and ``k`` (``dp.colluders``, below ``t``) the clients that may collude with the coordinator: they know their own shares
and can subtract them. Any ``|S| >= t`` survivors' sum, the colluders' shares taken out, holds ``|S| - k`` honest shares
and carries ``(|S| - k) / (t - k) >= 1`` times ``V`` (``noise.carried_variance``); the coordinator learns only that
sum and adds nothing. Counts, the sample count and the loss sums stay un-noised: public by design, as in central mode.

**The guarantee.** The sum of the ``n' = |S| - k`` honest shares is the distributed discrete Gaussian mechanism on the
integer query ``rint(x 2^f)``; its Renyi DP at every order ``alpha >= 1`` (Kairouz, Liu, Steinke 2021, Proposition
14; ``noise.distributed_rdp``), with sensitivities in grid units that include the rounding
(``noise.grid_sensitivity``: ``+ sqrt(m)`` in L2, ``m`` the entries one record changes), is

``eps(alpha) = min(alpha L2w^2 / (2 V) + tau m, alpha / 2 (L2w^2 / V + 2 tau L1 / sqrt(V_min) + tau^2 m), alpha / 2
(L2w / sqrt(V) + tau sqrt(m))^2)``, ``tau = 10 sum_{j=1}^{n'-1} exp(-2 pi^2 (V_min / n') j / (j + 1))``

per statistic, summed over the statistics (independent noise: Renyi DP adds). ``L2w`` is the L2 sensitivity in
the coordinates that make the Gram's noise isotropic (off-diagonal entries times ``sqrt 2``: ``C^2 2^f + d
sqrt(K)`` for ``K`` blocks of width ``d``), ``L1`` the plain one of the packed entries, ``V_min`` the least parameter
of an entry's sum (``V_G / 2`` off the Gram's diagonal): the bound holds entry by entry with each entry's own ``V``,
and each term only grows as a variance shrinks. ``log tau`` is about ``-pi^2 V_min / n'`` per statistic: below ``-3 x
10^11`` at ``F' = 1,152`` (the class sums' shares, the least, are about ``4 x 10^10`` grid units at ``epsilon`` 1 and 8,
``C = 1``), so ``tau`` is 0 in float64 and the bound is the Gaussian mechanism's ``alpha L2w^2 / (2 V)``.
``dp_accounting``'s RDP conversion (``compute_epsilon``, at the orders ``ORDERS``) turns it into ``(epsilon,
delta)``, ``delta`` the run's ``dp.delta``: the sampler is exact, so nothing is added to it. Calibration: ``V = s
sigma^2`` per statistic, ``sigma`` the central Gaussian calibration's, with the least ``s >= 1`` (bisection) whose
``epsilon`` at ``V`` meets the budget; the RDP conversion is looser than the analytic Gaussian's, so ``s`` is a little
above 1 (1.2 at ``epsilon`` 0.5, 1.13 at 8).

**The grid.** ``f`` (:func:`frac_bits`) is the most fractional bits at which a share (``/ (t - k)``) of up to
``HEADROOM x`` the Gaussian variance stays under ``GRID_CAP`` grid units: the grid step is then about ``2^-20`` of the
noise's deviation, and its rounding (the ``sqrt(m)`` terms) costs nothing measurable. It depends on the settings and
the number of clients alone, so client and coordinator derive it alike, and its bound is widened by a share's tail
(``noise.noisy_fixed_point``) so that an honest noisy sum decodes.

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

from common.privacy.gaussian import CLASS_SUM, GRAM, calibrate, gram_blocks
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.discrete_gaussian import MAX_COUNT, discrete_gaussian
from common.secagg.noise import (
    carried_variance,
    distributed_rdp,
    grid_sensitivity,
    grid_variance,
    log_tau,
    noisy_fixed_point,
    share_grid_variance,
    tail_bound,
)
from common.secagg.primitives import FixedPoint, SecAggError

GRID_CAP = 2.0**40  # a share's grid variance at most this: a grid step ~2^-20 of the noise's deviation is fine enough
HEADROOM = 4.0  # f leaves room for a calibrated variance of up to 4 sigma^2
ORDERS = (*(1 + j / 10 for j in range(1, 10)), *range(2, 257))  # the Renyi orders evaluated (the bound holds at all)
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
    gaussian = calibrate(dp, (GRAM, CLASS_SUM))  # a whole Gram's: a Gram of blocks has a smaller variance
    largest = max(r.sigma**2 for r in gaussian.values()) / honest_threshold(dp, threshold)
    f = math.floor((math.log2(GRID_CAP) - math.log2(HEADROOM * largest)) / 2)
    if f < 0:
        raise SecAggError(f"dp.mode = distributed: a share variance of {largest:g} exceeds the grid's cap")
    return min(f, secagg.frac_bits or 64)


def dp_fixed_point(dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> FixedPoint:
    """The encoding of a distributed-DP run: :func:`frac_bits`, ``secagg.bound`` widened by the tail of a share of
    the largest variance :func:`frac_bits` allows (over ``MAX_COUNT`` entries): client and coordinator alike."""
    f = frac_bits(dp, secagg, clients, threshold)
    fp = noisy_fixed_point(FixedPoint(frac_bits=f, bound=secagg.bound), tail_bound(GRID_CAP, MAX_COUNT))
    fp.check(clients)
    return fp


@dataclass(frozen=True)
class DistributedRelease:
    """One statistic's distributed discrete Gaussian mechanism: its L2 sensitivity in real units, the variance ``V``
    its diagonal (or every) entry's sum carries at least, and its shape on the grid: ``entries`` a record can change,
    ``isotropic`` the L2 norm of a unit rounding error in the noise-isotropic coordinates, ``least`` the least entry
    variance over ``V``."""

    sensitivity: float
    variance: float
    entries: int
    isotropic: float
    least: float

    def rdp(self, order: float, fp: FixedPoint, scale: float, shares: int) -> float:
        """``eps(alpha)`` (module docstring) when the sum of ``shares`` honest shares carries ``scale x V``."""
        v = grid_variance(self.variance * scale, fp)
        l2, l1 = grid_sensitivity(self.sensitivity, self.entries, fp)
        l2w = self.sensitivity * 2.0**fp.frac_bits + self.isotropic
        return distributed_rdp(order, l1, l2w, v, shares, self.entries, least=v * self.least)

    def log_tau(self, fp: FixedPoint, scale: float, shares: int) -> float:
        """``log tau`` of :meth:`rdp`: at the least share parameter, ``scale V V_min / V`` over ``shares``."""
        return log_tau(grid_variance(self.variance * scale, fp) * self.least / shares, shares)


def releases_of(
    dp: DpSettings, statistics: tuple[str, ...], gram_shape: tuple[int, ...], width: int, scale: float
) -> dict[str, DistributedRelease]:
    """The step's releases at ``scale x`` the Gaussian calibration's variances: the Gram of ``gram_shape`` (``(d, d)``
    or ``(K, d, d)``) when ``statistics`` hold it, and a class sum's row of ``width``."""
    gaussian = calibrate(dp, statistics, gram_blocks(gram_shape))
    out = {
        CLASS_SUM: DistributedRelease(
            gaussian[CLASS_SUM].sensitivity, scale * gaussian[CLASS_SUM].sigma ** 2, width, math.sqrt(width), 1.0
        )
    }
    if GRAM in gaussian:
        d, blocks = gram_shape[-1], math.prod(gram_shape[:-2])
        out[GRAM] = DistributedRelease(
            gaussian[GRAM].sensitivity,
            scale * gaussian[GRAM].sigma ** 2,
            blocks * d * (d + 1) // 2,
            d * math.sqrt(blocks),
            0.5,
        )
    return out


def epsilon(
    releases: dict[str, DistributedRelease], fp: FixedPoint, delta: float, scale: float = 1.0, *, shares: int
) -> float:
    """The ``epsilon`` at ``delta`` of the releases together when the sum of ``shares`` honest shares carries ``scale
    x`` their variances (``dp_accounting``'s conversion of the summed Renyi DP)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    rdp = [sum(r.rdp(order, fp, scale, shares) for r in releases.values()) for order in ORDERS]
    return float(compute_epsilon(ORDERS, rdp, delta)[0])


def calibrate_scale(releases: dict[str, DistributedRelease], fp: FixedPoint, dp: DpSettings, *, shares: int) -> float:
    """The least ``s`` in ``[1, HEADROOM]`` (to ``1e-6``) at which the releases meet ``(dp.epsilon, dp.delta)`` with
    ``shares`` honest shares in the sum (``t - k``: the fewest a step accepts)."""
    if epsilon(releases, fp, dp.delta, HEADROOM, shares=shares) > dp.epsilon:
        raise SecAggError(
            f"dp.mode = distributed: even {HEADROOM:g} x the Gaussian variance misses epsilon {dp.epsilon:g} on a "
            f"grid of 2^-{fp.frac_bits}"
        )
    if epsilon(releases, fp, dp.delta, shares=shares) <= dp.epsilon:
        return 1.0
    low, high = 1.0, HEADROOM
    while high - low > 1e-6:
        mid = (low + high) / 2
        low, high = (mid, high) if epsilon(releases, fp, dp.delta, mid, shares=shares) > dp.epsilon else (low, mid)
    return high


class DistributedNoise:
    """A run's distributed noise: the fixed point, the threshold, the colluders ``k = dp.colluders``, and per step
    shape the calibrated releases (``V = s sigma^2``); each client's share of a step (:meth:`share`) and what a sum
    of survivors carries against the coordinator and ``k`` colluders (:meth:`carried`, :meth:`report`)."""

    def __init__(self, dp: DpSettings, secagg: SecAggSettings, clients: int, threshold: int) -> None:
        self.dp, self.clients, self.threshold, self.colluders = dp, clients, threshold, dp.colluders
        self.fp = dp_fixed_point(dp, secagg, clients, threshold)
        self.share_tail = tail_bound(GRID_CAP, MAX_COUNT)  # the widening of fp's bound
        self._calibrated: dict[tuple, dict[str, DistributedRelease]] = {}

    def releases(
        self, statistics: tuple[str, ...], gram_shape: tuple[int, ...], width: int
    ) -> dict[str, DistributedRelease]:
        """The releases of a step whose Gram is ``gram_shape`` (``()``: none) and class sums' rows ``width`` wide,
        calibrated to the budget at ``t`` survivors (cached: one bisection per shape)."""
        key = (statistics, gram_shape, width)
        if key not in self._calibrated:
            unit = releases_of(self.dp, statistics, gram_shape, width, 1.0)
            s = calibrate_scale(unit, self.fp, self.dp, shares=self.threshold - self.colluders)
            self._calibrated[key] = releases_of(self.dp, statistics, gram_shape, width, s)
        return self._calibrated[key]

    def layout_releases(self, entries: tuple[tuple[str, tuple[int, ...]], ...]) -> dict[str, DistributedRelease]:
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

    def share_grid_variance(self, variance: float) -> int:
        """A share's parameter in grid units for a sum of ``variance`` (real units): ``ceil(V 4^f / (t - k))``."""
        return share_grid_variance(variance, self.fp, self.clients, self.threshold, colluders=self.colluders)

    def _draw(self, variance: float, count: int, context: bytes, index: int, what: bytes) -> np.ndarray:
        """``count`` discrete Gaussian entries of a share for a sum of ``variance`` (real units; the share's is over
        ``t - k``): from the CSPRNG, or with ``dp.seed >= 0`` from a key of the seed, the step, the client and
        ``what``."""
        seed = None
        if self.dp.seed >= 0:
            seed = hashlib.sha256(b"|".join([b"dp-share", str(self.dp.seed).encode(), context, b"%d" % index, what]))
        share = self.share_grid_variance(variance)
        return discrete_gaussian(share, count, seed=None if seed is None else seed.digest())

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

    def report(self, releases: dict[str, DistributedRelease], survivors: int) -> dict[str, Any]:
        """What a step of ``survivors`` carried against the coordinator and ``k`` colluders: per statistic the
        variance ``(|S| - k) V / (t - k)`` of its (diagonal) entries' sum and ``log tau`` of its ``|S| - k`` honest
        shares (``None``: one share, ``tau = 0``); the epsilon at ``dp.delta`` of that sum (at most the budget) and
        ``delta``, ``dp.delta``: no sampler's term (the sampler is exact)."""
        carried, honest = self.carried(survivors), survivors - self.colluders
        return {
            "variance": {name: carried * r.variance for name, r in releases.items()},
            "log_tau": {name: _finite(r.log_tau(self.fp, carried, honest)) for name, r in releases.items()},
            "epsilon": epsilon(releases, self.fp, self.dp.delta, carried, shares=honest),
            "survivors": survivors,
            "colluders": self.colluders,
            "threshold": self.threshold,
            "frac_bits": self.fp.frac_bits,
            "delta": self.dp.delta,
        }


def _finite(value: float) -> float | None:
    """``value``, or ``None`` for ``-inf`` (JSON has no infinities)."""
    return value if math.isfinite(value) else None
