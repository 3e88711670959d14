"""Gram statistics of the closed-form merges and heads: pure functions and running sums, float64 inside.

A Gram ``G = X^T X`` of ``d_in`` input features is a full matrix ``(d_in, d_in)`` or a vector ``(d_in,)`` meaning
``diag(g)``; :func:`decay_gram` shrinks its off-diagonal part, and a client with fewer samples than features sends
it as its factor ``R`` with ``R^T R = G`` (:func:`gram_factor`, :func:`block_gram_factor`). The accumulators add
Grams up over clients (:class:`GramSum`; :class:`BlockGramSum` for a ridge ensemble's diagonal blocks) or stack
their factors (:class:`GramRows`). RegMean's and LoRM's merges (:mod:`common.merges.regmean`) keep a
:class:`GramSum` as their denominator; the closed-form heads' statistics (``common/aggregation/features.py``) keep
all three; what a Gram is solved against is :mod:`common.merges.solve`'s.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import torch
from torch import Tensor

from common.merges.solve import DTYPE, _check_gram, _check_matrix, _f64


def decay_gram(g: Tensor, gamma: float) -> Tensor:
    """``gamma * G + (1 - gamma) * diag(G)``; a diagonal Gram ``(d_in,)`` is returned as is.

    With ``gamma = 0`` a full Gram becomes the vector ``diag(G)`` of shape ``(d_in,)``,
    which is all a client needs to send.
    """
    if not 0.0 <= gamma <= 1.0:
        raise ValueError(f"gamma must lie in [0, 1], got {gamma}")
    g = _f64(g)
    if g.dim() == 1:
        return g
    if g.dim() != 2 or g.shape[0] != g.shape[1]:
        raise ValueError(f"a Gram must be (d_in,) or square (d_in, d_in), got {tuple(g.shape)}")
    diag = torch.diagonal(g)
    if gamma == 0.0:
        return diag.clone()
    return gamma * g + (1.0 - gamma) * torch.diag(diag)


def _add_gram(total: Tensor | None, g: Tensor) -> Tensor:
    g = _f64(g)
    if total is None:
        return g.clone()
    if total.dim() == g.dim():
        return total + g
    # Mixed diagonal and full Grams: the sum is full.
    full_t = torch.diag(total) if total.dim() == 1 else total
    full_g = torch.diag(g) if g.dim() == 1 else g
    return full_t + full_g


# ----------------------------------------------------------------------------- accumulators


@dataclass
class GramSum:
    """Running sum of Grams ``S = sum_i G_i`` (diagonal stays diagonal until a full one arrives)."""

    SUMS: ClassVar[tuple[str, ...]] = (
        "total",
    )  # running sums (common/merges/sums.py): secure aggregation adds these up
    PARTS: ClassVar[tuple[str, ...]] = ()

    d_in: int
    total: Tensor | None = None
    count: int = 0

    def fold(self, g: Tensor) -> None:
        _check_gram(g, self.d_in, "gram")
        self.total = _add_gram(self.total, g)
        self.count += 1

    def fold_factor(self, r: Tensor) -> None:
        """Fold the Gram ``R^T R`` of a factor ``R: (k, d_in)`` (:func:`gram_factor`)."""
        _check_matrix(r, (None, self.d_in), "gram factor")
        self.fold(r.to(torch.float64).T @ r.to(torch.float64))

    def value(self) -> Tensor:
        if self.total is None:
            raise ValueError("GramSum: nothing folded yet")
        return self.total


@dataclass
class BlockGramSum:
    """Running sum of the ``K`` diagonal blocks ``(K, d, d)`` of Grams of ``K d`` features (``ridge.blocks``):
    the rest of the Gram is never formed. A :class:`GramSum` per block, in one tensor."""

    SUMS: ClassVar[tuple[str, ...]] = ("total",)  # as GramSum's: secure aggregation adds these up
    PARTS: ClassVar[tuple[str, ...]] = ()

    blocks: int
    d_in: int
    total: Tensor | None = None
    count: int = 0

    def fold(self, g: Tensor) -> None:
        """Add the blocks ``g: (K, d, d)``, in place: the total is this accumulator's own tensor (at K = 4 and
        d = 10,000 it is 3.2 GB, which a sum by copy would double)."""
        if tuple(g.shape) != (self.blocks, self.d_in, self.d_in):
            raise ValueError(
                f"gram blocks: expected shape ({self.blocks}, {self.d_in}, {self.d_in}), got {tuple(g.shape)}"
            )
        if self.total is None:
            self.total = _f64(g).clone()
        else:
            self.total.add_(_f64(g))
        self.count += 1

    def fold_factor(self, r: Tensor) -> None:
        """Fold the blocks ``R_k^T R_k`` of the factors ``R: (K, m, d)`` (:func:`block_gram_factor`), added in
        place with no ``(K, d, d)`` temporary."""
        if r.dim() != 3 or r.shape[0] != self.blocks or r.shape[2] != self.d_in:
            want = f"({self.blocks}, *, {self.d_in})"
            raise ValueError(f"gram block factors: expected shape {want}, got {tuple(r.shape)}")
        r = _f64(r)
        if self.total is None:
            self.total = torch.zeros(self.blocks, self.d_in, self.d_in, dtype=DTYPE)
        self.total.baddbmm_(r.transpose(1, 2), r)
        self.count += 1

    def value(self) -> Tensor:
        if self.total is None:
            raise ValueError("BlockGramSum: nothing folded yet")
        return self.total


@dataclass
class GramRows:
    """A Gram ``X^T X`` of ``d_in`` features kept whole as a factor ``R: (m, d_in)``, ``R^T R`` the Gram: the
    folded factors stacked, reduced by a QR to ``d_in`` rows whenever they outnumber the columns, so
    ``m <= min(n, d_in)`` for ``n`` samples (not a function of the number of clients). What an ensemble's own
    held-out error needs (``ridge.lambda_rule = 'average'``): the off-diagonal blocks too, in ``m d_in``
    numbers instead of ``d_in^2``. A stack, not a sum of per-client terms: no ``SUMS``, so no secure
    aggregation (``common/merges/sums.py``)."""

    d_in: int
    total: Tensor | None = None
    count: int = 0

    def fold(self, g: Tensor) -> None:
        raise ValueError("GramRows keeps the Gram as its factor: fold_factor(R), not the Gram itself")

    def fold_factor(self, r: Tensor) -> None:
        """Stack the factor ``R: (k, d_in)`` (:func:`gram_factor`) under the rows so far."""
        _check_matrix(r, (None, self.d_in), "gram factor")
        rows = _f64(r).clone() if self.total is None else torch.cat([self.total, _f64(r)])
        self.total = torch.linalg.qr(rows, mode="r").R if rows.shape[0] > self.d_in else rows
        self.count += 1

    def value(self) -> Tensor:
        """The factor ``R: (m, d_in)``."""
        if self.total is None:
            raise ValueError("GramRows: nothing folded yet")
        return self.total


def block_gram_factor(x: Tensor, blocks: int) -> Tensor:
    """``(K, min(n, d), d)``: :func:`gram_factor` of each of the ``K = blocks`` column blocks of width ``d``
    of ``X: (n, K d)``, i.e. the factors of the Gram's diagonal blocks ``X_k^T X_k``."""
    if x.shape[1] % blocks:
        raise ValueError(f"{x.shape[1]} features do not split into {blocks} blocks of equal width")
    return torch.stack([gram_factor(part) for part in x.chunk(blocks, dim=1)])


def gram_factor(x: Tensor) -> Tensor:
    """``R: (min(n, d), d)``, float64, with ``R^T R = X^T X`` for ``X: (n, d)``: QR's triangular factor.

    It carries exactly what the Gram does (``X`` up to a rotation) in ``min(n, d) * d`` numbers
    instead of ``d * d``: a client with fewer samples than feature dimensions sends its Gram
    this way (at ``d = 5000`` and 600 samples, 24 MB instead of 200 MB).
    """
    x = x.to(torch.float64)
    if x.shape[0] == 0:
        return torch.zeros(0, x.shape[1], dtype=torch.float64)
    return torch.linalg.qr(x, mode="r").R[: min(x.shape)]
