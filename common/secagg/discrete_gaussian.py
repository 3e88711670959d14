"""An exact sampler of the discrete Gaussian ``N_Z(0, sigma^2)``: integer arithmetic on a ChaCha20 key stream.

**The law.** ``P(X = x) = exp(-x^2 / (2 sigma^2)) / sum_{y in Z} exp(-y^2 / (2 sigma^2))`` on the integers, for a
rational ``sigma^2`` (an ``int`` or a ``fractions.Fraction``; a ``float`` is refused: it would be a rounded
parameter). Canonne, Kamath, Steinke 2020 ("The Discrete Gaussian for Differential Privacy", NeurIPS), whose
three algorithms this module follows:

1. ``Bernoulli(exp(-gamma))`` for a rational ``gamma >= 0`` (:func:`bernoulli_exp`): for ``gamma`` in ``[0, 1]``
   draw ``A_K ~ Bernoulli(gamma / K)`` for ``K = 1, 2, ...`` until one fails, and return whether that ``K`` is odd;
   for larger ``gamma``, ``floor(gamma)`` draws at ``gamma = 1`` and one at ``gamma - floor(gamma)``, all true.
2. The discrete Laplace of scale ``t`` (an integer): ``U`` uniform on ``{0, .., t - 1}``, kept with probability
   ``exp(-U / t)``; ``V`` the successes of ``Bernoulli(exp(-1))`` before its first failure; ``X = U + t V`` with a
   fair sign, ``-0`` rejected.
3. The discrete Gaussian: ``t = floor(sigma) + 1``, ``Y`` discrete Laplace of scale ``t``, kept with probability
   ``exp(-(|Y| - sigma^2 / t)^2 / (2 sigma^2))``.

Every draw is exact: no step rounds. A ``Bernoulli(p)`` of a rational ``p`` compares a uniform real ``U`` with
``p`` 64 bits at a time: a uniform word ``w`` against ``floor(p 2^64)``, decided unless the two are equal, in which
case (probability ``2^-64``) the next word is compared against the next 64 bits of ``p``'s expansion
(:func:`bernoulli`). The thresholds come from Python integers: at a grid variance of ``2^38`` the acceptance
exponent's numerator ``(|Y| t - sigma^2)^2`` reaches ``2^80``, past ``int64``. Uniform integers on ``{0, .., t - 1}``
are words below the largest multiple of ``t``, reduced mod ``t`` (the rest redrawn).

**Vectorised.** Every loop runs over the entries still pending, as numpy arrays: one round draws a word per pending
entry; only the acceptance exponent (numpy object arrays of Python integers, about half the time) and the ties (one
in ``2^64``) go entry by entry. Measured (``bench/secagg_noise.py``, one core of a 2-core AMD EPYC host beside two
1-thread benchmark jobs), at a variance of ``2^38`` grid units: ``10^5`` entries in 0.08 to 0.14 s, ``10^6`` in 1.0
to 1.8 s (three runs); per entry 1.31 discrete Laplace draws (the Gaussian's test accepts 0.76), 1.58 uniforms per
Laplace draw, 12.3 words.

**The generator.** Words come from a ChaCha20 key stream whose 32-byte key is ``secrets.token_bytes`` (the OS
CSPRNG) by default, or HKDF of a caller's 32-byte ``seed``, a mode for tests and reproducible comparisons only
(``seed`` is keyword-only; nothing defaults to it). numpy's generators are never used.
"""

from __future__ import annotations

import math
import secrets
from collections.abc import Callable
from fractions import Fraction

import numpy as np
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.primitives import SecAggError

SEED_BYTES = 32
WORD = 1 << 64  # a word's range: the uniforms are 64-bit integers
MAX_WORDS = 2**34  # 8 bytes each: 128 GiB of the 256 GiB a ChaCha20 key (32-bit block counter) gives
MAX_COUNT = 2**28  # entries per call: a draw takes 12 to 19 words an entry on average, well within MAX_WORDS
MAX_VARIANCE = 2**60  # sigma^2 at most this: the Laplace scale t = floor(sigma) + 1 stays below 2^31
Rational = int | Fraction


class KeyStream:
    """Uniform 64-bit words from a ChaCha20 key stream: a fresh CSPRNG key, or (tests only) one derived from
    ``seed``."""

    def __init__(self, *, seed: bytes | None = None) -> None:
        if seed is None:
            key = secrets.token_bytes(SEED_BYTES)
        elif len(seed) != SEED_BYTES:
            raise SecAggError(f"noise: expected a {SEED_BYTES}-byte seed, got {len(seed)} bytes")
        else:  # domain-separated, so that a seed used elsewhere (a mask's) never gives the same stream
            key = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-dp-noise").derive(seed)
        self._encryptor = Cipher(algorithms.ChaCha20(key, b"\x00" * 16), mode=None).encryptor()
        self._drawn = 0

    @property
    def drawn(self) -> int:
        """The words served so far."""
        return self._drawn

    def words(self, count: int) -> np.ndarray:
        """``count`` uniform integers on ``[0, 2^64)``, ``(count,)`` uint64."""
        self._drawn += count
        if self._drawn > MAX_WORDS:
            raise SecAggError(f"noise: a key stream serves {MAX_WORDS} words at most")
        return np.frombuffer(self._encryptor.update(bytes(8 * count)), dtype="<u8").copy()


def rational(value: object, what: str) -> Fraction:
    """``value`` as an exact ``Fraction >= 0``; ``SecAggError`` for a float (already rounded) or anything else."""
    if isinstance(value, bool) or not isinstance(value, int | Fraction):
        raise SecAggError(f"noise: expected {what} as an int or a Fraction (exact), got {type(value).__name__} {value}")
    if value < 0:
        raise SecAggError(f"noise: expected {what} >= 0, got {value}")
    return Fraction(value)


# ------------------------------------------------------------------------- Bernoulli trials


def bernoulli(p: Fraction, stream: KeyStream) -> bool:
    """One exact ``Bernoulli(p)``, ``p`` in ``[0, 1]``: ``U < p`` for a uniform real ``U`` read 64 bits at a time."""
    while True:
        scaled = p * WORD
        threshold = math.floor(scaled)
        w = int(stream.words(1)[0])
        if w != threshold:
            return w < threshold
        p = scaled - threshold  # U's next bits against p's next bits


def _below(thresholds: np.ndarray, exact: Callable[[int], Fraction], stream: KeyStream) -> np.ndarray:
    """``Bernoulli(p_j)`` per entry, ``(m,)`` bool, given ``thresholds = floor(p_j 2^64)`` (uint64, ``p_j < 1``) and
    ``exact(j) = p_j``: a word below its threshold succeeds, above it fails, equal to it reads further bits."""
    w = stream.words(len(thresholds))
    out = w < thresholds
    for j in np.flatnonzero(w == thresholds):
        out[j] = bernoulli(exact(int(j)) * WORD - int(thresholds[j]), stream)
    return out


def _alternating(
    count: int,
    first: int,
    ratio: Callable[[int, np.ndarray], tuple[np.ndarray, Callable[[int], Fraction]]],
    stream: KeyStream,
) -> np.ndarray:
    """Algorithm 1's loop over ``count`` entries from ``K = first``: ``Bernoulli(gamma / K)`` until one fails, true
    where that ``K`` is odd. ``ratio(K, pending)``: the pending entries' thresholds of ``gamma / K`` and their exact
    values by position."""
    out = np.zeros(count, dtype=bool)
    pending = np.arange(count)
    k = first
    while pending.size:
        thresholds, exact = ratio(k, pending)
        go = _below(thresholds, exact, stream)
        out[pending[~go]] = k % 2 == 1
        pending = pending[go]
        k += 1
    return out


def _exp_minus_one(count: int, stream: KeyStream) -> np.ndarray:
    """``count`` draws of ``Bernoulli(exp(-1))``: Algorithm 1 at ``gamma = 1`` (``K = 1`` always succeeds)."""

    def ratio(k: int, pending: np.ndarray) -> tuple[np.ndarray, Callable[[int], Fraction]]:
        return np.full(pending.size, WORD // k, dtype=np.uint64), lambda j: Fraction(1, k)

    return _alternating(count, 2, ratio, stream)


def _exp_minus(
    whole: np.ndarray, fraction: np.ndarray, exact: Callable[[int], Fraction], stream: KeyStream
) -> np.ndarray:
    """``Bernoulli(exp(-gamma_j))`` per entry, ``gamma_j = whole_j + f_j``: ``whole`` (int64) the integer parts,
    ``fraction = floor(f_j 2^64)`` (uint64) and ``exact(j) = f_j`` in ``[0, 1)``. True iff all ``whole_j`` draws at
    ``exp(-1)`` and the one at ``exp(-f_j)`` succeed (independent: their product's law)."""
    alive = np.ones(len(whole), dtype=bool)
    pending = np.flatnonzero(whole > 0)
    left = whole[pending]
    while pending.size:
        ok = _exp_minus_one(pending.size, stream)
        alive[pending[~ok]] = False
        keep = ok & (left > 1)
        pending, left = pending[keep], left[keep] - 1
    rest = np.flatnonzero(alive)

    def ratio(k: int, at: np.ndarray) -> tuple[np.ndarray, Callable[[int], Fraction]]:
        return fraction[rest[at]] // np.uint64(k), lambda j: exact(int(rest[at[j]])) / k

    alive[rest] = _alternating(rest.size, 1, ratio, stream)
    return alive


def _ratios(numerators: np.ndarray, den: int) -> Callable[[int], Fraction]:
    """Entry ``j``'s exact ``numerators[j] / den`` (for the ties of :func:`_below`)."""
    return lambda j: Fraction(int(numerators[j]), den)


def split(gamma: Fraction) -> tuple[int, int]:
    """``(floor(gamma), floor(frac(gamma) 2^64))``: the integer part and the fraction's first 64 bits, exactly."""
    whole, rest = divmod(gamma.numerator, gamma.denominator)
    return whole, (rest << 64) // gamma.denominator


def bernoulli_exp(
    gamma: Rational, count: int, *, seed: bytes | None = None, stream: KeyStream | None = None
) -> np.ndarray:
    """``count`` exact draws of ``Bernoulli(exp(-gamma))``, ``(count,)`` bool, for a rational ``gamma >= 0``."""
    g = rational(gamma, "gamma")
    stream = stream or KeyStream(seed=seed)
    whole, fraction = split(g)
    frac = g - whole
    return _exp_minus(
        np.full(count, whole, dtype=np.int64), np.full(count, fraction, dtype=np.uint64), lambda j: frac, stream
    )


# ------------------------------------------------------------------------- the discrete Laplace and Gaussian


def _uniform_below(t: int, count: int, stream: KeyStream) -> np.ndarray:
    """``count`` uniform integers on ``{0, .., t - 1}``, ``(count,)`` uint64: words below the largest multiple of
    ``t`` under ``2^64``, reduced mod ``t``; the others redrawn."""
    last = np.uint64((WORD // t) * t - 1)
    out = np.empty(count, dtype=np.uint64)
    pending = np.arange(count)
    while pending.size:
        w = stream.words(pending.size)
        ok = w <= last
        out[pending[ok]] = w[ok] % np.uint64(t)
        pending = pending[~ok]
    return out


def _over(u: np.ndarray, t: int) -> np.ndarray:
    """``floor(u 2^64 / t)`` for ``u < t < 2^32``, uint64, in two 32-bit long-division steps (no product overflows)."""
    t64, shift = np.uint64(t), np.uint64(32)
    high = (u << shift) // t64
    low = (((u << shift) % t64) << shift) // t64
    return (high << shift) + low


def discrete_laplace(t: int, count: int, stream: KeyStream) -> np.ndarray:
    """``count`` draws of the discrete Laplace of integer scale ``t`` (``P(x) ~ exp(-|x| / t)``), ``(count,)`` int64:
    Algorithm 2 of Canonne, Kamath, Steinke 2020 (module docstring), each rejected entry tried again."""
    out = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        u = _uniform_below(t, pending.size, stream)
        kept = np.flatnonzero(_exp_minus(np.zeros(u.size, np.int64), _over(u, t), _ratios(u, t), stream))
        x = u[kept].astype(np.int64) + t * _geometric(kept.size, stream)
        negative = (stream.words(kept.size) >> np.uint64(63)).astype(bool)
        valid = ~(negative & (x == 0))
        done = kept[valid]
        out[pending[done]] = np.where(negative, -x, x)[valid]
        retry = np.ones(pending.size, dtype=bool)
        retry[done] = False
        pending = pending[retry]
    return out


def _geometric(count: int, stream: KeyStream) -> np.ndarray:
    """``count`` counts of ``Bernoulli(exp(-1))`` successes before the first failure, ``(count,)`` int64."""
    out = np.zeros(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        ok = _exp_minus_one(pending.size, stream)
        out[pending[ok]] += 1
        pending = pending[ok]
    return out


def discrete_gaussian(
    variance: Rational, count: int, *, seed: bytes | None = None, stream: KeyStream | None = None
) -> np.ndarray:
    """``count`` independent draws of ``N_Z(0, variance)``, ``(count,)`` int64, exact, for a rational ``sigma^2 =
    a / b`` (``int`` or ``Fraction``) in ``[0, 2^60]``: Algorithm 3 of Canonne, Kamath, Steinke 2020 with ``t =
    floor(sigma) + 1``, the test ``exp(-gamma)`` at ``gamma = (|Y| t b - a)^2 / (2 a b t^2)``."""
    s2 = rational(variance, "a variance")
    if s2 > MAX_VARIANCE:
        raise SecAggError(f"noise: expected a variance of at most 2^60 grid units, got {float(s2):g}")
    if not 0 <= count <= MAX_COUNT:
        raise SecAggError(f"noise: expected at most {MAX_COUNT} entries per call, got {count}")
    if s2 == 0:
        return np.zeros(count, dtype=np.int64)
    stream = stream or KeyStream(seed=seed)
    a, b = s2.numerator, s2.denominator
    t = math.isqrt(a // b) + 1
    den = 2 * a * b * t * t
    out = np.empty(count, dtype=np.int64)
    pending = np.arange(count)
    while pending.size:
        y = discrete_laplace(t, pending.size, stream)
        z = np.abs(y).astype(object) * (t * b) - a  # Python integers: z^2 passes 2^64
        num = z * z
        whole = num // den
        rest = num - whole * den
        fraction = ((rest << 64) // den).astype(np.uint64)
        keep = _exp_minus(whole.astype(np.int64), fraction, _ratios(rest, den), stream)
        out[pending[keep]] = y[keep]
        pending = pending[~keep]
    return out
