"""Distributed noise for secure aggregation: each client's Skellam share, so that the survivors' sum is private.

**The mechanism.** Client ``i`` adds an integer noise vector ``e_i`` to its encoded values before masking:
``y_i = encode(x_i) + e_i + masks``. The coordinator learns only ``sum_{i in S} (encode(x_i) + e_i)`` over the
survivors ``S``: it never sees a term with less noise than the sum's. Each ``e_i`` is symmetric Skellam,
``e_i = P_i - P'_i`` with ``P_i, P'_i ~ Poisson(v / 2)`` independent per entry (``Sk(v/2, v/2)``, variance
``v``). Poissons are closed under sums, so ``sum_{i in S} e_i`` is *exactly* ``Sk(|S| v / 2, |S| v / 2)``:
the sum is one Skellam mechanism of variance ``|S| v`` (Agarwal, Kairouz, Liu, NeurIPS 2021). The discrete
Gaussian (Canonne, Kamath, Steinke 2020) was the alternative; its shares do not sum to a discrete Gaussian
(Kairouz, Liu, Steinke 2021 bound the gap), and an exact sampler needs rational arithmetic entry by entry.

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
own shares and can take them out: against ``c`` of them the shares are ``sigma^2 / (t - c)``.

**The generator.** Bits come from a ChaCha20 key stream whose 32-byte key is ``secrets.token_bytes`` (the
OS CSPRNG) by default, or HKDF of a caller's 32-byte ``seed``, a mode for tests and reproducible
comparisons only (``seed`` is keyword-only; nothing defaults to it). numpy's generators are never used.
Poisson variates: inversion of the cumulative law for means below 10, else Hoermann's PTRS (transformed
rejection with squeeze, 1993), vectorised: both exact in real arithmetic, not bit-exact in float64. The
accept test's log-pmf is evaluated in Stirling's cancellation-free form (absolute error about ``eps |k -
lambda|``: 2e-9 at ``lambda = 2^40``, 12 sd out, against 60-digit arithmetic; the textbook ``k log lambda -
lgamma(k + 1)`` loses ``eps lambda log lambda``, 3e-3 there). The uniforms' ``2^-52`` grid gives each value
``k`` about ``2^52 / (2.5 sqrt(lambda))`` grid points (``2e9`` at ``2^40``) and misplaces at most one per
value, a total variation of about ``10 sqrt(lambda) 2^-52`` over the bulk (``2e-9`` at ``2^40``), and the
accept test's uniform adds ``2^-52`` per try. :func:`poisson_tv` sums these into a bound per variate,
:func:`skellam_tv` per entry (below ``3e-9`` at a grid variance of ``2^38``); the cap on the mean, ``2^40``, keeps
a variate's below ``4e-9``. Over every entry of every share a sum holds, the bound ``TV`` is what the sampled
mechanism's law may differ from the exact one's, so an ``(eps, delta)`` of the exact mechanism holds for the sampled
one at ``(eps, delta + (1 + e^eps) TV)`` (``common/secagg/distributed_dp.py`` states it per step).
tensorflow_privacy's ``DistributedSkellamSumQuery`` draws its shares with ``tf.random.stateless_poisson``
seeded by the clock's microseconds (neither cryptographic nor unpredictable); this module keeps a
cryptographic source and pays about twice numpy's time (``bench/secagg_noise.py``: ``10^6`` entries in
0.07 to 0.25 s on one loaded EPYC core).

**Overflow.** Skellam noise is unbounded; :func:`tail_bound` gives a magnitude that ``count`` entries
exceed with probability at most ``failure`` (Chernoff: ``P(Z >= a) <= exp(-(a asinh(a/V) - sqrt(a^2 +
V^2) + V))``). :func:`noisy_fixed_point` widens a :class:`FixedPoint`'s bound by one share's tail, so that
``check`` and ``decode`` hold for noisy terms, and :func:`add_noise` refuses a share beyond it (never
clips it: clipping would change the noise's law).
"""

from __future__ import annotations

import math
import secrets

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.primitives import FixedPoint, SecAggError, ring_add

SEED_BYTES = 32
MAX_MEAN = 2.0**40  # the largest Poisson mean sampled: its law stays within 1e-8 of Poisson's (module docstring)
MAX_UNIFORMS = 2**32  # 8 bytes each: 32 GiB of the 256 GiB a ChaCha20 key (32-bit block counter) gives
MAX_COUNT = 2**28  # entries per call: a Skellam draws about 4.6 uniforms an entry, well within MAX_UNIFORMS
INVERSION_BELOW = 10.0  # PTRS holds for means >= 10; below, inversion of the cumulative law
DEFAULT_FAILURE = 2.0**-64  # the probability that a share exceeds its tail bound (then refused, not clipped)
UNIFORM_STEP = 2.0**-52  # the uniforms' grid (KeyStream.uniforms)
PTRS_ACCEPTANCE = 0.7  # PTRS accepts a try with at least this probability for means >= 10 (measured: 0.75 at 10)


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


def grid_sensitivity(l2: float, entries: int, fp: FixedPoint) -> tuple[float, float]:
    """``(L2, L1)`` sensitivity in grid units of the rounded values ``rint(x 2^f)``.

    ``l2``: how far one record moves a client's real values (``||x - x'||_2``); ``entries``: how many
    entries one record can change (``m``). ``L2 <= l2 2^f + sqrt(m)``, ``L1 <= sqrt(m) l2 2^f + m``:
    ``rint(a) - rint(b) = (a - b) + (r_a - r_b)`` with ``|r_a - r_b| <= 1`` where ``a != b`` and ``0`` elsewhere."""
    if not (math.isfinite(l2) and l2 >= 0 and entries >= 1):
        raise SecAggError(f"noise: expected a finite l2 >= 0 and entries >= 1, got l2 {l2}, entries {entries}")
    scaled = l2 * 2.0**fp.frac_bits
    return scaled + math.sqrt(entries), math.sqrt(entries) * scaled + entries


def skellam_rdp(order: int, l1: float, l2: float, variance: float) -> float:
    """The Renyi DP at integer ``order`` ``alpha > 1`` of the Skellam mechanism of ``variance`` ``V`` (noise
    ``Sk(V/2, V/2)``) on an integer query of sensitivities ``l1``, ``l2`` in grid units (Agarwal, Kairouz, Liu,
    NeurIPS 2021, Corollary 3.6):

    ``eps(alpha) = alpha l2^2 / (2 V) + min((2 alpha l2^2 + 6 l1) / (4 V^2), 3 l1 / (2 V))``

    Its first term is the Gaussian mechanism's; the rest is the price of the integer lattice. Readings of the
    corollary differ between ``2 alpha - 1`` and ``2 alpha`` in the lattice term: the larger is used, an upper
    bound of both, so the stated epsilon is never the smaller reading's. The bound is
    stated for integer orders only: an accountant must evaluate it at those."""
    if not (order > 1 and float(order).is_integer() and variance > 0 and l1 >= 0 and l2 >= 0):
        raise SecAggError(
            f"noise: expected an integer order > 1, variance > 0, l1, l2 >= 0, got {order}, {variance}, {l1}, {l2}"
        )
    return order * l2**2 / (2 * variance) + min(
        (2 * order * l2**2 + 6 * l1) / (4 * variance**2), 3 * l1 / (2 * variance)
    )


# ------------------------------------------------------------------------- the bit source


class KeyStream:
    """Uniforms from a ChaCha20 key stream: a fresh CSPRNG key, or (tests only) one derived from ``seed``."""

    def __init__(self, *, seed: bytes | None = None) -> None:
        if seed is None:
            key = secrets.token_bytes(SEED_BYTES)
        elif len(seed) != SEED_BYTES:
            raise SecAggError(f"noise: expected a {SEED_BYTES}-byte seed, got {len(seed)} bytes")
        else:  # domain-separated, so that a seed used elsewhere (a mask's) never gives the same stream
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-dp-noise").derive(seed)
        self._encryptor = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor()
        self._drawn = 0

    def uniforms(self, count: int) -> np.ndarray:
        """``count`` uniforms on ``(0, 1)``: 52 random bits each, at the cells' midpoints ``(j + 1/2) 2^-52``
        (never 0 or 1)."""
        self._drawn += count
        if self._drawn > MAX_UNIFORMS:
            raise SecAggError(f"noise: a key stream serves {MAX_UNIFORMS} uniforms at most")
        words = np.frombuffer(self._encryptor.update(bytes(8 * count)), dtype="<u8")
        return ((words >> np.uint64(12)).astype(np.float64) + 0.5) * 2.0**-52


# ------------------------------------------------------------------------- Poisson and Skellam


_LOG_FACTORIAL = np.array([math.lgamma(k + 1) for k in range(16)])


def _log_pmf(k: np.ndarray, mean: float) -> np.ndarray:
    """``log P(Poisson(mean) = k)``, ``k: (m,)`` integer-valued floats >= 0, without cancellation: for ``k >= 16``
    ``-mean h((k - mean) / mean) - log(2 pi k) / 2 - S(k)``, ``h(u) = (1 + u) log1p(u) - u``, ``S`` Stirling's
    series of ``log k! - (k log k - k + log(2 pi k) / 2)`` (truncation error below ``1e-13``)."""
    out = np.empty_like(k)
    small = k < 16
    ks = k[small]
    out[small] = -mean + ks * math.log(mean) - _LOG_FACTORIAL[ks.astype(np.int64)]
    kl = k[~small]
    u = (kl - mean) / mean
    h = (1 + u) * np.log1p(u) - u
    inv = 1.0 / kl
    inv2 = inv * inv
    series = inv * (1 / 12 - inv2 * (1 / 360 - inv2 * (1 / 1260 - inv2 / 1680)))
    out[~small] = -mean * h - 0.5 * np.log(2 * math.pi * kl) - series
    return out


def _inversion(mean: float, count: int, stream: KeyStream) -> np.ndarray:
    """Poisson variates by inversion of the cumulative law, cut where the tail is below ``2^-60``."""
    top = int(mean + 40 * math.sqrt(mean) + 60)
    k = np.arange(top + 1, dtype=np.float64)
    log_fact = np.array([math.lgamma(j + 1) for j in range(top + 1)])
    cdf = np.cumsum(np.exp(-mean + k * math.log(mean) - log_fact))
    return np.minimum(np.searchsorted(cdf, stream.uniforms(count), side="right"), top).astype(np.int64)


def _ptrs(mean: float, count: int, stream: KeyStream) -> np.ndarray:
    """Poisson variates by PTRS (Hoermann 1993), ``mean >= 10``: ``k = floor((2a / u_s + b) U + mean + 0.43)``,
    accepted at once in the squeeze, else when ``V alpha^-1 / (a / u_s^2 + b) <= P(k)``; rejected entries redrawn."""
    b = 0.931 + 2.53 * math.sqrt(mean)
    a = -0.059 + 0.02483 * b
    inv_alpha = 1.1239 + 1.1328 / (b - 3.4)
    v_r = 0.9277 - 3.6224 / (b - 2)
    out = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        m = pending.size
        drawn = stream.uniforms(2 * m)
        u, v = drawn[:m] - 0.5, drawn[m:]
        us = 0.5 - np.abs(u)
        k = np.floor((2 * a / us + b) * u + mean + 0.43)
        valid = (k >= 0) & (k < 2.0**53)  # k >= 2^53 (not exact in float64) has a negligible pmf: rejected anyway
        accept = valid & (us >= 0.07) & (v <= v_r)
        test = valid & ~accept & ~((us < 0.013) & (v > us))
        hat = np.log(v[test] * inv_alpha / (a / (us[test] * us[test]) + b))
        accept[test] = hat <= _log_pmf(k[test], mean)
        out[pending[accept]] = k[accept].astype(np.int64)
        pending = pending[~accept]
    return out


def poisson(mean: float, count: int, *, seed: bytes | None = None, stream: KeyStream | None = None) -> np.ndarray:
    """``count`` independent ``Poisson(mean)`` variates, ``(count,)`` int64, from the CSPRNG (``seed``: tests only)."""
    if not (math.isfinite(mean) and 0 <= mean <= MAX_MEAN):
        raise SecAggError(f"noise: expected a Poisson mean in [0, 2^40], got {mean}")
    if not 0 <= count <= MAX_COUNT:
        raise SecAggError(f"noise: expected at most {MAX_COUNT} entries per call, got {count}")
    stream = stream or KeyStream(seed=seed)
    if mean == 0:
        return np.zeros(count, dtype=np.int64)
    return _inversion(mean, count, stream) if mean < INVERSION_BELOW else _ptrs(mean, count, stream)


def skellam(variance: float, count: int, *, seed: bytes | None = None) -> np.ndarray:
    """``count`` independent ``Sk(variance / 2, variance / 2)`` variates (``P - P'``, mean 0), ``(count,)`` int64.

    ``SecAggError`` beyond a variance of ``2^41`` grid units: lower ``frac_bits`` (each bit fewer divides the
    grid variance by 4; the noise then dwarfs the coarser grid's rounding all the more)."""
    if not (math.isfinite(variance) and 0 <= variance <= 2 * MAX_MEAN):
        bits = math.ceil(math.log2(variance / (2 * MAX_MEAN)) / 2) if variance > 2 * MAX_MEAN else 0
        raise SecAggError(
            f"noise: expected a share variance in [0, 2^41] grid units, got {variance:g}"
            + (f": lower frac_bits by at least {bits}" if bits else "")
        )
    stream = KeyStream(seed=seed)
    return poisson(variance / 2, count, stream=stream) - poisson(variance / 2, count, stream=stream)


def poisson_tv(mean: float) -> float:
    """A bound on the total variation between :func:`poisson`'s law at ``mean`` in float64 and Poisson's.

    Inversion (``mean < 10``): each of the ``top + 1`` cells of the cumulative law moves by at most ``4 (top + 1)``
    units of ``h = 2^-52`` (the uniforms' grid, each term's and the cumulative sum's rounding), and the cut tail
    holds ``2^-60``. PTRS: per try, the uniform ``U``'s grid misplaces at most one grid point per value over the
    bulk (``10 sqrt(mean) h``, module docstring), the log-pmf's error ``eps |k - mean|`` moves the accept test by
    ``sqrt(mean) h`` on average, and ``V``'s grid by ``h``; the accepted law is that over the acceptance probability
    (at least ``PTRS_ACCEPTANCE``), so ``TV <= (11 sqrt(mean) + 1) h / 0.7 <= (16 sqrt(mean) + 2) h``. An analysis,
    not a machine-checked proof: it bounds the known sources of the float64 error, each estimated upward."""
    if not (math.isfinite(mean) and 0 <= mean <= MAX_MEAN):
        raise SecAggError(f"noise: expected a Poisson mean in [0, 2^40], got {mean}")
    if mean == 0:
        return 0.0  # no draw: exactly zero
    if mean < INVERSION_BELOW:
        top = int(mean + 40 * math.sqrt(mean) + 60)
        return 4 * (top + 1) ** 2 * UNIFORM_STEP + 2.0**-60
    return (11 * math.sqrt(mean) + 1) * UNIFORM_STEP / PTRS_ACCEPTANCE


def skellam_tv(variance: float) -> float:
    """A bound on the total variation of one :func:`skellam` entry of ``variance`` (grid units) from
    ``Sk(variance / 2, variance / 2)``'s law: its two Poissons' bounds added (independent draws)."""
    return 2 * poisson_tv(variance / 2)


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
    ``clients`` survive (less ``colluders``): ``Sk`` of variance ``grid_variance(variance / (t - c))``, ``(count,)``
    int64 in grid units."""
    v = share_variance(variance, clients, threshold, colluders=colluders)
    return skellam(grid_variance(v, fp), count, seed=seed)


# ------------------------------------------------------------------------- the ring and its headroom


def tail_bound(variance: float, count: int, failure: float = DEFAULT_FAILURE) -> int:
    """An integer ``a`` with ``P(max_j |Z_j| > a) <= failure`` for ``count`` entries ``Z_j ~ Sk`` of ``variance``.

    Chernoff with the Skellam's log-MGF ``V (cosh s - 1)``: ``P(|Z| >= a) <= 2 exp(-psi(a))``, ``psi(a) =
    a asinh(a / V) - sqrt(a^2 + V^2) + V``; ``a`` solves ``psi(a) = log(2 count / failure)`` (bisection)."""
    if not (variance >= 0 and count >= 1 and 0 < failure < 1):
        raise SecAggError(
            f"noise: expected variance >= 0, count >= 1, 0 < failure < 1, got {variance}, {count}, {failure}"
        )
    if variance == 0:
        return 0
    target = math.log(2 * count / failure)

    def psi(a: float) -> float:
        return a * math.asinh(a / variance) - math.hypot(a, variance) + variance

    low, high = 0.0, math.sqrt(2 * variance * target) + target  # a first guess (Bernstein's form), doubled if short
    while psi(high) < target:
        high *= 2
    for _ in range(200):
        mid = (low + high) / 2
        low, high = (mid, high) if psi(mid) < target else (low, mid)
    return math.ceil(high)


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
