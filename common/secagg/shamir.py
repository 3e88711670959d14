"""Shamir's secret sharing over GF(2^16), symbol by symbol, vectorised with numpy.

A secret of 16 or 32 bytes is 8 or 16 symbols of GF(2^16) (big-endian 16-bit words); each symbol is shared on
its own polynomial of degree ``t - 1`` whose other coefficients come from the OS's CSPRNG, and a holder's share
is its polynomial values at its x-coordinate (``1 .. 65535``), as many bytes as the secret. Any ``t`` shares
rebuild every symbol by Lagrange interpolation at zero; fewer say nothing of it (each symbol's shares of
``t - 1`` holders are uniform whatever the secret: Shamir 1979, per symbol, as in SSSS and HashiCorp Vault).

Why not GF(2^128) (pycryptodome's): a product there costs a carry-less multiplication of two 128-bit numbers in
Python, so dealing to ``n`` holders costs ``n t`` of them (24 s a client at ``n = 1000``, measured) and the
coordinator's interpolation, whose x-coordinates differ per owner on a sparse graph, ``t^2`` per owner. Over
GF(2^16) a product is two table look-ups and an addition of logarithms: dealing is ``t`` vectorised steps over
the holders, and the interpolation coefficients come from sums of logarithms over a ``t x t`` table.

The field: polynomials over GF(2) modulo ``x^16 + x^12 + x^3 + x + 1`` (primitive: ``x`` generates all
``2^16 - 1`` non-zero elements, checked when the tables are built).
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import numpy as np

ORDER = (1 << 16) - 1  # of the multiplicative group
POLYNOMIAL = 0x1100B  # x^16 + x^12 + x^3 + x + 1
MAX_HOLDERS = ORDER  # x-coordinates 1 .. 2^16 - 1


class ShamirError(ValueError):
    """A sharing or rebuilding that cannot be done: its message says why."""


def _tables() -> tuple[np.ndarray, np.ndarray]:
    """``EXP[k] = x^k`` (for ``k`` in ``0 .. 2 ORDER``, so that a sum of two logarithms needs no reduction) and
    ``LOG[a]`` (``LOG[0]`` unused)."""
    exp = np.zeros(2 * ORDER + 1, dtype=np.int64)
    log = np.zeros(1 << 16, dtype=np.int64)
    value = 1
    for k in range(ORDER):
        exp[k] = value
        log[value] = k
        value <<= 1
        if value >> 16:
            value ^= POLYNOMIAL
    if value != 1 or len(set(exp[:ORDER].tolist())) != ORDER:
        raise AssertionError("the field's polynomial is not primitive")
    exp[ORDER:] = np.concatenate([exp[:ORDER], exp[:1]])
    return exp, log


EXP, LOG = _tables()


def multiply(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a * b`` element-wise in GF(2^16) (arrays of symbols, broadcast)."""
    a, b = np.asarray(a, dtype=np.int64), np.asarray(b, dtype=np.int64)
    product = EXP[LOG[a] + LOG[b]]
    return np.where((a == 0) | (b == 0), 0, product)


def _symbols(secret: bytes) -> np.ndarray:
    return np.frombuffer(secret, dtype=">u2").astype(np.int64)


def _bytes(symbols: np.ndarray) -> bytes:
    return np.asarray(symbols, dtype=">u2").tobytes()


def split(secret: bytes, threshold: int, xs: list[int]) -> list[bytes]:
    """Shares of ``secret`` (an even number of bytes) at the x-coordinates ``xs`` (distinct, in ``1 .. 2^16 - 1``),
    any ``threshold`` of which rebuild it: one share per x, as many bytes as the secret."""
    if not 1 <= threshold <= len(xs):
        raise ShamirError(f"a threshold of {threshold} among {len(xs)} holders")
    if len(set(xs)) != len(xs) or not all(1 <= x <= MAX_HOLDERS for x in xs):
        raise ShamirError(f"x-coordinates must be distinct and lie in 1..{MAX_HOLDERS}")
    if len(secret) % 2:
        raise ShamirError(f"a secret of {len(secret)} bytes: whole 16-bit symbols only")
    constant = _symbols(secret)
    width = len(constant)
    coefficients = np.frombuffer(os.urandom(2 * width * (threshold - 1)), dtype=">u2").astype(np.int64)
    coefficients = coefficients.reshape(threshold - 1, width)
    x = np.asarray(xs, dtype=np.int64)[:, None]
    values = np.zeros((len(xs), width), dtype=np.int64)
    for c in coefficients:  # Horner, from the highest degree; the secret is the constant term
        values = multiply(values, x) ^ c
    values = multiply(values, x) ^ constant if threshold > 1 else np.broadcast_to(constant, values.shape)
    return [_bytes(v) for v in values]


def lagrange_at_zero(xs: tuple[int, ...]) -> np.ndarray:
    """``l_j(0) = prod_{m != j} x_m / (x_j + x_m)`` for each ``x_j`` of ``xs`` (distinct, non-zero), as symbols:
    logarithms summed over a ``t x t`` table (addition is XOR)."""
    x = np.asarray(xs, dtype=np.int64)
    if len(set(xs)) != len(xs) or (x <= 0).any() or (x > MAX_HOLDERS).any():
        raise ShamirError(f"x-coordinates must be distinct and lie in 1..{MAX_HOLDERS}")
    logs = LOG[x]
    differences = x[:, None] ^ x[None, :]
    np.fill_diagonal(differences, 1)  # log 1 = 0: the diagonal adds nothing
    numerator = logs.sum() - logs  # sum over m != j of log x_m
    denominator = LOG[differences].sum(axis=1)
    return EXP[(numerator - denominator) % ORDER]


def interpolate(shares: Mapping[int, bytes], threshold: int) -> bytes:
    """The secret from ``threshold`` shares (x-coordinate -> share; the ``threshold`` lowest x are used)."""
    if len(shares) < threshold:
        raise ShamirError(f"{len(shares)} shares, {threshold} needed")
    chosen = sorted(shares)[:threshold]
    sizes = {len(shares[x]) for x in chosen}
    if len(sizes) != 1 or sizes.pop() % 2:
        raise ShamirError("shares of unequal or odd sizes")
    coefficients = lagrange_at_zero(tuple(chosen))
    values = np.stack([_symbols(shares[x]) for x in chosen])
    return _bytes(np.bitwise_xor.reduce(multiply(values, coefficients[:, None]), axis=0))
