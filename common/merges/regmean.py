"""Closed-form merges of LoRM (docs/METHOD.md §2): pure functions, float64 inside.

Every merge here is the exact least-squares minimiser of its objective. A Gram is passed
either as a full matrix ``G: (d_in, d_in)`` or as a vector ``g: (d_in,)`` meaning the
diagonal Gram ``diag(g)``; Grams are taken *after* decay (see :func:`decay_gram`).

Each merge is a ratio of sums of per-client (or per-task) terms, so each has a streaming
accumulator that folds one term at a time and holds memory independent of how many were
folded. The list functions are defined through the accumulators, so both give identical
results for the same inputs in the same order.

Solves never form an explicit inverse. Input columns whose total Gram is zero, or below
``d * eps`` of the largest diagonal entry (dead inputs), give zero columns in the result, as a
pseudo-inverse would; a full Gram that is singular on
its support falls back to the pseudo-inverse, ``M pinv(S)``: the minimum-norm minimiser, as
in the reference implementation.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

DTYPE = torch.float64


# ----------------------------------------------------------------------------- helpers


def _f64(x: Tensor) -> Tensor:
    return x.detach().to(DTYPE)


def _check_gram(g: Tensor, d_in: int, what: str) -> None:
    if g.dim() == 1 and g.shape[0] == d_in:
        return
    if g.dim() == 2 and tuple(g.shape) == (d_in, d_in):
        return
    raise ValueError(f"{what}: expected a Gram of shape ({d_in},) or ({d_in}, {d_in}), got {tuple(g.shape)}")


def _check_matrix(x: Tensor, shape: tuple[int | None, int | None], what: str) -> None:
    ok = x.dim() == 2 and all(want is None or want == got for want, got in zip(shape, x.shape))
    if not ok:
        want = "(" + ", ".join("*" if s is None else str(s) for s in shape) + ")"
        raise ValueError(f"{what}: expected shape {want}, got {tuple(x.shape)}")


def gram_times(m: Tensor, g: Tensor) -> Tensor:
    """``M @ G`` for ``M: (p, d_in)`` and a full or diagonal Gram ``G``; float64."""
    m, g = _f64(m), _f64(g)
    return m * g if g.dim() == 1 else m @ g


def right_solve(m: Tensor, s: Tensor, shift: float = 0.0) -> Tensor:
    """Least-squares ``X`` with ``X @ (S + shift I) = M``, ``M: (p, d)``, ``S`` symmetric PSD (full or diagonal).

    Columns where the shifted diagonal is zero or below ``d * eps`` of its largest entry (dead inputs)
    give zeros. A full matrix that is positive definite on the remaining support is solved by
    Cholesky; one that is singular there (rank-deficient inputs) by the pseudo-inverse:
    ``M pinv(S + shift I)``, the minimum-norm solution.

    ``shift`` (a ridge's ``lambda``) is added to the diagonal inside the solve, never to a copy of ``S``: the result
    is bit for bit that of ``right_solve(m, s + shift * I)``, and a full ``S`` with every input alive costs one
    ``(d, d)`` work matrix beside it (a ridge head's Gram block is 0.8 GB at ``d = 10,000``; the explicit sum, the
    scaled copy and LAPACK's own copies held five).
    """
    m, s = _f64(m), _f64(s)
    if s.dim() == 1:
        s = s + shift if shift else s
        alive = _alive(s)
        safe = torch.where(alive, s, torch.ones_like(s))
        return torch.where(alive, m / safe, torch.zeros_like(m))
    alive = _alive(torch.diagonal(s) + shift)
    if bool(alive.all()):
        return _spd_right_solve(m, s, shift)
    out = torch.zeros_like(m)
    if not bool(alive.any()):
        return out
    idx = alive.nonzero().squeeze(1)
    s_sub = s.index_select(0, idx).index_select(1, idx)
    out[:, idx] = _spd_right_solve(m.index_select(1, idx), s_sub, shift)
    return out


def _alive(diag: Tensor) -> Tensor:
    """Inputs whose Gram diagonal is above ``d * eps`` of the largest: the rest are dead. An input whose
    energy is 10^-62 of another's (a feature that is 10^-31 on every sample, as some of MiniLM's pooled
    features are) carries nothing float64 can resolve; kept, its Jacobi scale of 10^31 turned rounding
    noise into head entries of 10^30, and whether such an input survived depended on summation order
    (secure aggregation's fixed point rounds it to zero)."""
    if diag.numel() == 0:
        return diag > 0
    return diag > diag.shape[0] * torch.finfo(DTYPE).eps * diag.max().clamp_min(0.0)


def _spd_right_solve(m: Tensor, s: Tensor, shift: float = 0.0) -> Tensor:
    """``X @ (S + shift I) = M`` for ``S + shift I`` with a positive diagonal; ``M pinv(S + shift I)`` if it is
    singular. The Jacobi-scaled matrix is written once, column-major (LAPACK's order, so that neither the
    factorisation nor the triangular solves copy it), and factored in place."""
    d = s.shape[0]
    tol = d * torch.finfo(DTYPE).eps
    # Jacobi scaling keeps the singularity test independent of the inputs' units.
    diag = torch.diagonal(s) + shift if shift else torch.diagonal(s)
    scale = diag.rsqrt()
    work = torch.empty_strided((d, d), (1, d), dtype=DTYPE, device=s.device)
    torch.mul(s, scale[:, None], out=work)
    work.mul_(scale[None, :])  # D (S + shift I) D, its diagonal set apart
    if shift:
        work.diagonal().copy_(diag * scale * scale)
    info = torch.empty((), dtype=torch.int32, device=s.device)
    torch.linalg.cholesky_ex(work, out=(work, info))  # its lower triangle: L, with L L^T = D (S + shift I) D
    if int(info) == 0 and float(torch.diagonal(work).min()) ** 2 > tol * 100:
        # X S = M  <=>  S X^T = M^T  (S symmetric); with S_n = D S D = L L^T: X = (L^-T L^-1 (D M^T))^T D
        y = torch.linalg.solve_triangular(work, (m * scale).T, upper=False)
        y = torch.linalg.solve_triangular(work.mT, y, upper=True)
        return y.T * scale
    del work
    # Singular: the Euclidean pseudo-inverse of S + shift I itself (scaling would change which minimiser).
    shifted = s.clone()
    shifted.diagonal().add_(shift)
    evals, evecs = torch.linalg.eigh(shifted)
    keep = evals > tol * evals.max()
    inv = torch.where(keep, 1.0 / torch.where(keep, evals, torch.ones_like(evals)), torch.zeros_like(evals))
    return (m @ evecs * inv) @ evecs.T


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
