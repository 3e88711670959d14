"""Closed-form merges of LoRM (docs/METHOD.md §2): pure functions, float64 inside.

Every merge here is the exact least-squares minimiser of its objective. A Gram is passed
either as a full matrix ``G: (d_in, d_in)`` or as a vector ``g: (d_in,)`` meaning the
diagonal Gram ``diag(g)``; Grams are taken *after* decay (see
:func:`~common.merges.grams.decay_gram`).

Each merge is a ratio of sums of per-client (or per-task) terms, so each has a streaming
accumulator that folds one term at a time and holds memory independent of how many were
folded. The list functions are defined through the accumulators, so both give identical
results for the same inputs in the same order. The sums of Grams are
:class:`~common.merges.grams.GramSum`'s, and every merge ends in the one solve of
:mod:`common.merges.solve`, which never forms an explicit inverse.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from common.merges.grams import GramSum
from common.merges.solve import _check_gram, _check_matrix, _f64, gram_times, right_solve

# ----------------------------------------------------------------------------- accumulators


@dataclass
class RegMeanAccumulator:
    """``W = (sum_i W_i G_i)(sum_i G_i)^-1`` with ``W_i: (d_out, d_in)``.

    Minimises ``sum_i ||W X_i - W_i X_i||^2`` where ``G_i = X_i^T X_i``.
    """

    SUMS: ClassVar[tuple[str, ...]] = ("numerator",)
    PARTS: ClassVar[tuple[str, ...]] = ("grams",)

    d_out: int
    d_in: int
    numerator: Tensor | None = None  # (d_out, d_in): sum_i W_i G_i
    grams: GramSum = field(init=False)

    def __post_init__(self) -> None:
        self.grams = GramSum(self.d_in)

    @property
    def count(self) -> int:
        return self.grams.count

    def fold(self, w: Tensor, g: Tensor) -> None:
        _check_matrix(w, (self.d_out, self.d_in), "regmean weight")
        _check_gram(g, self.d_in, "regmean gram")
        term = gram_times(w, g)
        self.numerator = term if self.numerator is None else self.numerator + term
        self.grams.fold(g)

    def result(self) -> Tensor:
        if self.numerator is None:
            raise ValueError("RegMeanAccumulator: nothing folded yet")
        return right_solve(self.numerator, self.grams.value())


@dataclass
class LoraBAccumulator:
    """B-round (``A`` shared): ``B = (sum_i B_i A G_i A^T)(A (sum_i G_i) A^T)^-1``.

    Minimises ``sum_i ||(B - B_i) A X_i||^2``; ``B_i: (d_out, r)``, ``A: (r, d_in)``.
    Holds only ``(d_out, r)`` and ``(r, r)`` sums: an ``r x r`` solve at the end.
    """

    SUMS: ClassVar[tuple[str, ...]] = ("numerator", "projected")  # not ``a``: the shared A is no sum
    PARTS: ClassVar[tuple[str, ...]] = ()

    a: Tensor  # (r, d_in), shared by every client this round
    d_out: int
    numerator: Tensor | None = None  # (d_out, r): sum_i B_i A G_i A^T
    projected: Tensor | None = None  # (r, r): sum_i A G_i A^T
    count: int = 0

    def __post_init__(self) -> None:
        if self.a.dim() != 2:
            raise ValueError(f"shared A must be (r, d_in), got {tuple(self.a.shape)}")
        self.a = _f64(self.a).clone()  # the caller may change its A later; the merge must not

    def fold(self, b: Tensor, g: Tensor) -> None:
        r, d_in = self.a.shape
        _check_matrix(b, (self.d_out, r), "lora B")
        _check_gram(g, d_in, "lora B-round gram")
        agat = gram_times(self.a, g) @ self.a.T  # (r, r)
        term = _f64(b) @ agat
        self.numerator = term if self.numerator is None else self.numerator + term
        self.projected = agat if self.projected is None else self.projected + agat
        self.count += 1

    def result(self) -> Tensor:
        if self.numerator is None or self.projected is None:
            raise ValueError("LoraBAccumulator: nothing folded yet")
        return right_solve(self.numerator, self.projected)


@dataclass
class LoraAAccumulator:
    """A-round (``B`` shared): ``A = (sum_i A_i G_i)(sum_i G_i)^-1`` with ``A_i: (r, d_in)``.

    Minimises ``sum_i ||B (A - A_i) X_i||^2`` (independently of the shared ``B``).
    """

    SUMS: ClassVar[tuple[str, ...]] = ()
    PARTS: ClassVar[tuple[str, ...]] = ("inner",)

    r: int
    d_in: int
    inner: RegMeanAccumulator = field(init=False)

    def __post_init__(self) -> None:
        self.inner = RegMeanAccumulator(self.r, self.d_in)

    @property
    def count(self) -> int:
        return self.inner.count

    def fold(self, a: Tensor, g: Tensor) -> None:
        _check_matrix(a, (self.r, self.d_in), "lora A")
        self.inner.fold(a, g)

    def result(self) -> Tensor:
        return self.inner.result()


@dataclass
class TaskMergeAccumulator:
    """Task merge in low-rank form: ``dW = (sum_t B^t A^t G^t)(sum_t G^t)^-1 = B_cat @ A_cat``.

    ``B_cat = [B^1 ... B^T]: (d_out, sum_t r_t)`` and ``A_cat`` stacks ``A^t G^t S^-1``
    (``(sum_t r_t, d_in)``) with ``S = sum_t G^t``. It keeps each task's ``B^t`` and
    ``A^t G^t`` (growing with the number of tasks, never with clients) and one running ``S``.
    """

    d_out: int
    d_in: int
    bs: list[Tensor] = field(default_factory=list)  # B^t: (d_out, r_t)
    ags: list[Tensor] = field(default_factory=list)  # A^t G^t: (r_t, d_in)
    grams: GramSum = field(init=False)

    def __post_init__(self) -> None:
        self.grams = GramSum(self.d_in)

    @property
    def count(self) -> int:
        return len(self.bs)

    def fold(self, b: Tensor, a: Tensor, g: Tensor) -> None:
        _check_matrix(b, (self.d_out, None), "task B")
        _check_matrix(a, (b.shape[1], self.d_in), "task A")
        _check_gram(g, self.d_in, "task gram")
        self.bs.append(_f64(b).clone())
        self.ags.append(gram_times(a, g))
        self.grams.fold(g)

    def result(self) -> tuple[Tensor, Tensor]:
        if not self.bs:
            raise ValueError("TaskMergeAccumulator: nothing folded yet")
        b_cat = torch.cat(self.bs, dim=1)
        a_cat = right_solve(torch.cat(self.ags, dim=0), self.grams.value())
        return b_cat, a_cat


@dataclass
class WeightedMeanAccumulator:
    """``x = sum_i n_i x_i / sum_i n_i`` (e.g. the head bias weighted by sample counts); a client of
    ``n_i = 0`` (none of the task's samples) adds nothing."""

    SUMS: ClassVar[tuple[str, ...]] = ("numerator", "weight")
    PARTS: ClassVar[tuple[str, ...]] = ()

    shape: tuple[int, ...]
    numerator: Tensor | None = None
    weight: float = 0.0
    count: int = 0

    def fold(self, x: Tensor, n: float) -> None:
        if tuple(x.shape) != tuple(self.shape):
            raise ValueError(f"weighted mean: expected shape {tuple(self.shape)}, got {tuple(x.shape)}")
        if not (n >= 0 and math.isfinite(n)):
            raise ValueError(f"weighted mean: weight must be finite and >= 0, got {n}")
        term = _f64(x) * float(n)
        self.numerator = term if self.numerator is None else self.numerator + term
        self.weight += float(n)
        self.count += 1

    def result(self) -> Tensor:
        if self.numerator is None:
            raise ValueError("WeightedMeanAccumulator: nothing folded yet")
        if not self.weight > 0:
            raise ValueError(f"weighted mean: the {self.count} updates folded all have weight 0 (no samples)")
        return self.numerator / self.weight


# ----------------------------------------------------------------------------- list API


def _nonempty(xs: Sequence, what: str) -> None:
    if len(xs) == 0:
        raise ValueError(f"{what}: need at least one input")


def _same_length(a: Sequence, b: Sequence, what: str) -> None:
    if len(a) != len(b):
        raise ValueError(f"{what}: {len(a)} matrices but {len(b)} Grams")


def regmean(ws: Sequence[Tensor], gs: Sequence[Tensor]) -> Tensor:
    """RegMean: ``W = (sum_i W_i G_i)(sum_i G_i)^-1``; ``ws[i]: (d_out, d_in)`` -> ``(d_out, d_in)``."""
    _nonempty(ws, "regmean")
    _same_length(ws, gs, "regmean")
    _check_matrix(ws[0], (None, None), "regmean weight")
    acc = RegMeanAccumulator(*ws[0].shape)
    for w, g in zip(ws, gs):
        acc.fold(w, g)
    return acc.result()


def merge_lora_b(bs: Sequence[Tensor], a: Tensor, gs: Sequence[Tensor]) -> Tensor:
    """B-round: ``B = (sum_i B_i A G_i A^T)(A S A^T)^-1``; ``bs[i]: (d_out, r)``, ``a: (r, d_in)``."""
    _nonempty(bs, "merge_lora_b")
    _same_length(bs, gs, "merge_lora_b")
    _check_matrix(bs[0], (None, None), "lora B")
    acc = LoraBAccumulator(a, bs[0].shape[0])
    for b, g in zip(bs, gs):
        acc.fold(b, g)
    return acc.result()


def merge_lora_a(as_: Sequence[Tensor], gs: Sequence[Tensor]) -> Tensor:
    """A-round: ``A = (sum_i A_i G_i)(sum_i G_i)^-1``; ``as_[i]: (r, d_in)`` -> ``(r, d_in)``."""
    _nonempty(as_, "merge_lora_a")
    _same_length(as_, gs, "merge_lora_a")
    _check_matrix(as_[0], (None, None), "lora A")
    acc = LoraAAccumulator(*as_[0].shape)
    for a, g in zip(as_, gs):
        acc.fold(a, g)
    return acc.result()


def merge_tasks(bs: Sequence[Tensor], as_: Sequence[Tensor], gs: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """Task merge: ``(B_cat, A_cat)`` with ``B_cat @ A_cat = (sum_t B^t A^t G^t)(sum_t G^t)^-1``.

    ``bs[t]: (d_out, r_t)``, ``as_[t]: (r_t, d_in)``; ``B_cat: (d_out, sum r_t)``,
    ``A_cat: (sum r_t, d_in)``.
    """
    _nonempty(bs, "merge_tasks")
    _same_length(bs, gs, "merge_tasks")
    if len(as_) != len(bs):
        raise ValueError(f"merge_tasks: {len(bs)} B factors but {len(as_)} A factors")
    _check_matrix(bs[0], (None, None), "task B")
    _check_matrix(as_[0], (None, None), "task A")
    acc = TaskMergeAccumulator(bs[0].shape[0], as_[0].shape[1])
    for b, a, g in zip(bs, as_, gs):
        acc.fold(b, a, g)
    return acc.result()


def weighted_mean(xs: Sequence[Tensor], ns: Sequence[float]) -> Tensor:
    """``sum_i n_i x_i / sum_i n_i``."""
    _nonempty(xs, "weighted_mean")
    if len(xs) != len(ns):
        raise ValueError(f"weighted_mean: {len(xs)} tensors but {len(ns)} weights")
    acc = WeightedMeanAccumulator(tuple(xs[0].shape))
    for x, n in zip(xs, ns):
        acc.fold(x, n)
    return acc.result()
