"""Closed-form merges of (IA)^3 and VeRA vectors (docs/METHOD.md §6, "Other adapters: exact merges"), exact and as the
paper's appendix writes them.

Each merge minimises ``sum_i ||dW(v) X_i - dW(v_i) X_i||^2`` over the merged vector ``v``, where client
``i`` trained ``v_i`` and ``G_i = X_i X_i^T`` is its Gram (``(d_in, d_in)``, or its diagonal
``(d_in,)``); ``dW`` is linear in ``v``, so the minimiser solves a small linear system:

- (IA)^3 on a layer's output, ``dW = diag(l) W0``: per output ``j``, the mean of ``l_ij`` weighted by
  ``e_ij = (W0 G_i W0^T)_jj`` (:func:`ia3_output`);
- (IA)^3 on a layer's input, ``h = W (l * z)``: ``l = (sum H_i)^-1 sum H_i l_i`` with ``H_i = (W^T W) o G_i``
  (:func:`ia3_input`);
- VeRA, ``dW = diag(lb) B diag(ld) A`` with frozen random ``B (d_out, r)``, ``A (r, d_in)``, the vectors
  solved alternately as LoRM alternates ``B`` and ``A``: with ``lb`` fixed, ``M = diag(lb) B``,
  ``H_i = (M^T M) o (A G_i A^T)``, ``ld = (sum H_i)^-1 sum H_i ld_i`` (:func:`vera_d`; a client sends
  ``A G_i A^T``, ``r x r``, never a dense Gram); with ``ld`` fixed, ``N = B diag(ld) A``, per output ``j``
  the mean of ``lb_ij`` weighted by ``c_ij = (N G_i N^T)_jj`` (:func:`vera_b`).

``form="appendix"`` gives the paper's formulas instead: the RegMean merge of the clients' dense deltas,
divided element-wise by the frozen matrix and averaged along its rows. They are not the least-squares
minimisers unless the Grams make every element agree (e.g. all clients equal); the tests show both.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from common.merges.regmean import RegMeanAccumulator
from common.merges.solve import gram_times, right_solve

F64 = torch.float64


def _full(g: Tensor) -> Tensor:
    g = g.to(F64)
    return torch.diag(g) if g.dim() == 1 else g


def _weighted_mean(vectors: Sequence[Tensor], weights: Sequence[Tensor]) -> Tensor:
    """Per coordinate ``sum_i w_i v_i / sum_i w_i`` (0 where every weight is 0)."""
    num = sum(w * v.to(F64) for v, w in zip(vectors, weights, strict=True))
    den = sum(weights)
    assert isinstance(num, Tensor) and isinstance(den, Tensor)
    return torch.where(den > 0, num / torch.where(den > 0, den, torch.ones_like(den)), torch.zeros_like(den))


def _quadratic_solve(vectors: Sequence[Tensor], hessians: Sequence[Tensor]) -> Tensor:
    """``v = (sum H_i)^-1 sum H_i v_i`` for symmetric PSD ``H_i`` (minimum-norm where singular)."""
    rhs = sum(h @ v.to(F64) for v, h in zip(vectors, hessians, strict=True))
    total = sum(hessians)
    assert isinstance(rhs, Tensor) and isinstance(total, Tensor)
    return right_solve(rhs[None, :], total)[0]


def _appendix(deltas: Sequence[Tensor], grams: Sequence[Tensor], frozen: Tensor) -> Tensor:
    """The appendix's rule: RegMean of the dense deltas, divided element-wise by ``frozen``, row means."""
    num = sum(gram_times(d, g) for d, g in zip(deltas, grams, strict=True))
    total = sum(_full(g) for g in grams)
    assert isinstance(num, Tensor) and isinstance(total, Tensor)
    merged = right_solve(num, total)
    return (merged / frozen.to(F64)).mean(dim=1)


def ia3_output(ls: Sequence[Tensor], grams: Sequence[Tensor], w0: Tensor, form: str = "exact") -> Tensor:
    """Merged ``l (d_out,)`` of ``dW = diag(l) W0`` from the clients' ``l_i`` and Grams."""
    w0 = w0.to(F64)
    if form == "appendix":
        return _appendix([ell.to(F64)[:, None] * w0 for ell in ls], grams, w0)
    weights = [(gram_times(w0, g) * w0).sum(1) for g in grams]  # diag(W0 G W0^T)
    return _weighted_mean(ls, weights)


def ia3_input(ls: Sequence[Tensor], grams: Sequence[Tensor], w: Tensor) -> Tensor:
    """Merged ``l (d_in,)`` of ``h = W (l * z)`` from the clients' ``l_i`` and Grams (exact)."""
    wtw = w.to(F64).T @ w.to(F64)
    return _quadratic_solve(ls, [wtw * _full(g) for g in grams])


def vera_d(
    lds: Sequence[Tensor],
    projected: Sequence[Tensor],
    b: Tensor,
    lb: Tensor,
    form: str = "exact",
    *,
    grams: Sequence[Tensor] = (),
    a: Tensor | None = None,
) -> Tensor:
    """Merged ``ld (r,)`` with ``lb`` fixed, from the clients' ``ld_i`` and ``A G_i A^T (r, r)`` (``projected``).

    ``form="appendix"`` needs the full ``grams`` and ``A`` instead: the appendix's rule works on
    ``diag(ld_i) A G_i``, so a client would have to send its dense Gram."""
    if form == "appendix":
        assert a is not None and grams, "the appendix's rule needs the Grams and A"
        return _appendix([ld.to(F64)[:, None] * a.to(F64) for ld in lds], grams, a)
    m = lb.to(F64)[:, None] * b.to(F64)
    mtm = m.T @ m
    return _quadratic_solve(lds, [mtm * p.to(F64) for p in projected])


def vera_b(
    lbs: Sequence[Tensor], grams: Sequence[Tensor], b: Tensor, a: Tensor, ld: Tensor, form: str = "exact"
) -> Tensor:
    """Merged ``lb (d_out,)`` with ``ld`` fixed, from the clients' ``lb_i`` and Grams."""
    b, a, ld = b.to(F64), a.to(F64), ld.to(F64)
    scaled_a = ld[:, None] * a  # diag(ld) A: (r, d_in)
    if form == "appendix":
        projected = [gram_times(scaled_a, g) @ scaled_a.T for g in grams]  # A' G_i A'^T
        return _appendix([lb.to(F64)[:, None] * b for lb in lbs], projected, b)
    n = b @ scaled_a  # (d_out, d_in)
    return _weighted_mean(lbs, [(gram_times(n, g) * n).sum(1) for g in grams])


# ----------------------------------------------------------------------------- running sums
#
# The same merges as running sums over clients (``common/merges/sums.py``), for the coordinator: each client
# sends its trained vector and a statistic of its Gram computed on its side (:func:`vera_statistic`),
# never the Gram itself, and the coordinator's memory does not grow with the number of clients.


def _vector(v: Tensor, size: int, what: str) -> Tensor:
    if tuple(v.shape) != (size,):
        raise ValueError(f"{what}: expected shape ({size},), got {tuple(v.shape)}")
    return v.to(F64)


@dataclass
class VectorMeanAccumulator:
    """Per coordinate ``v = sum_i w_i o v_i / sum_i w_i`` (coordinates no client weighs give 0): VeRA's
    ``lb`` with ``w_i = c_i``, (IA)^3 on the output with ``w_i = e_i``."""

    SUMS: ClassVar[tuple[str, ...]] = ("numerator", "weight")
    PARTS: ClassVar[tuple[str, ...]] = ()

    size: int
    numerator: Tensor | None = None  # (size,): sum_i w_i o v_i
    weight: Tensor | None = None  # (size,): sum_i w_i
    count: int = 0

    def fold(self, v: Tensor, w: Tensor) -> None:
        v, w = _vector(v, self.size, "vector"), _vector(w, self.size, "vector weight")
        if not bool(torch.isfinite(w).all()) or bool((w < 0).any()):
            raise ValueError("vector weight: expected finite non-negative entries")
        self.numerator = w * v if self.numerator is None else self.numerator + w * v
        self.weight = w.clone() if self.weight is None else self.weight + w
        self.count += 1

    def result(self) -> Tensor:
        if self.numerator is None or self.weight is None:
            raise ValueError("VectorMeanAccumulator: nothing folded yet")
        return right_solve(self.numerator[None, :], self.weight)[0]


@dataclass
class QuadraticAccumulator:
    """``v = (sum_i H_i)^-1 sum_i H_i v_i`` with ``H_i = K o P_i``: ``K (r, r)`` shared by every client
    (VeRA's ``M^T M``), ``P_i`` a client's statistic (``A G_i A^T``), or its diagonal Gram ``G_i`` where
    ``A`` (``frozen``) is given: then ``P_i`` is formed here (:func:`vera_quadratic`)."""

    SUMS: ClassVar[tuple[str, ...]] = ("rhs", "total")
    PARTS: ClassVar[tuple[str, ...]] = ()

    shared: Tensor  # K: (r, r)
    frozen: Tensor | None = None  # A: (r, d_in), to form A G_i A^T from a diagonal G_i
    rhs: Tensor | None = None  # (r,): sum_i H_i v_i
    total: Tensor | None = None  # (r, r): sum_i H_i
    count: int = 0

    def __post_init__(self) -> None:
        self.shared = self.shared.to(F64).clone()

    def fold(self, v: Tensor, p: Tensor) -> None:
        r = self.shared.shape[0]
        v = _vector(v, r, "vector")
        if p.dim() == 1 and self.frozen is not None and p.shape[0] == self.frozen.shape[1]:
            p = vera_quadratic(self.frozen, p)
        if tuple(p.shape) != (r, r):
            diagonal = f" or a diagonal Gram ({self.frozen.shape[1]},)" if self.frozen is not None else ""
            raise ValueError(f"quadratic statistic: expected shape ({r}, {r}){diagonal}, got {tuple(p.shape)}")
        h = self.shared * p.to(F64)
        self.rhs = h @ v if self.rhs is None else self.rhs + h @ v
        self.total = h if self.total is None else self.total + h
        self.count += 1

    def result(self) -> Tensor:
        if self.rhs is None or self.total is None:
            raise ValueError("QuadraticAccumulator: nothing folded yet")
        return right_solve(self.rhs[None, :], self.total)[0]


@dataclass
class AppendixAccumulator:
    """The appendix's rule as running sums: RegMean of the dense ``diag(v_i) F`` with the clients' Grams
    ``G_i`` (of ``F``'s input), divided element-wise by ``F`` and averaged along its rows."""

    SUMS: ClassVar[tuple[str, ...]] = ()
    PARTS: ClassVar[tuple[str, ...]] = ("inner",)

    frozen: Tensor  # F: (size, width)
    inner: RegMeanAccumulator = field(init=False)

    def __post_init__(self) -> None:
        self.frozen = self.frozen.to(F64).clone()
        self.inner = RegMeanAccumulator(*self.frozen.shape)

    @property
    def count(self) -> int:
        return self.inner.count

    def fold(self, v: Tensor, g: Tensor) -> None:
        self.inner.fold(_vector(v, self.frozen.shape[0], "vector")[:, None] * self.frozen, g)

    def result(self) -> Tensor:
        return (self.inner.result() / self.frozen).mean(dim=1)


def vera_statistic(side: str, form: str, gram: Tensor, b: Tensor, a: Tensor, lb: Tensor, ld: Tensor) -> Tensor:
    """What a client sends of its Gram ``G_i`` (decayed as the run's backbone gamma says) for a VeRA round
    that trained ``side``, with the shared vectors ``lb``, ``ld`` and the frozen ``B``, ``A``:

    - ``"B"`` (``lb``), exact: ``c_i = diag(N G_i N^T)``, ``N = B diag(ld) A``: ``(d_out,)``;
    - ``"A"`` (``ld``), exact: ``A G_i A^T``: ``(r, r)``, or the diagonal Gram itself where it is smaller
      (:func:`vera_sends_diagonal`; the coordinator forms ``A G_i A^T`` with the same ``A``:
      :func:`vera_quadratic`);
    - ``"B"``, appendix: ``A' G_i A'^T`` with ``A' = diag(ld) A``: ``(r, r)``;
    - ``"A"``, appendix: ``G_i`` itself, as LoRM's A round sends it.
    """
    b, a, lb, ld = b.to(F64), a.to(F64), lb.to(F64), ld.to(F64)
    if side == "A":
        if form == "appendix" or vera_sends_diagonal(form, gram.dim() == 2, a.shape[0], a.shape[1]):
            return gram.to(F64)
        return vera_quadratic(a, gram)
    scaled_a = ld[:, None] * a
    if form == "appendix":
        return gram_times(scaled_a, gram) @ scaled_a.T
    n = b @ scaled_a
    return (gram_times(n, gram) * n).sum(1)


def vera_sends_diagonal(form: str, full: bool, rank: int, d_in: int) -> bool:
    """Whether an exact VeRA ``ld`` round sends the client's diagonal Gram ``(d_in,)`` rather than
    ``A G_i A^T`` ``(r, r)``: where the Gram is diagonal and has fewer entries."""
    return form == "exact" and not full and d_in < rank * rank


def vera_quadratic(a: Tensor, gram: Tensor) -> Tensor:
    """``A G_i A^T`` ``(r, r)``, float64: the ``ld`` round's statistic, on whichever side forms it."""
    a = a.to(F64)
    return gram_times(a, gram) @ a.T


def vera_accumulator(
    side: str, form: str, b: Tensor, a: Tensor, lb: Tensor, ld: Tensor
) -> VectorMeanAccumulator | QuadraticAccumulator | AppendixAccumulator:
    """The running sums of one layer's VeRA round that trains ``side``, given the shared vectors."""
    if form == "appendix":
        return AppendixAccumulator(b if side == "B" else a)
    if side == "B":
        return VectorMeanAccumulator(b.shape[0])
    m = lb.to(F64)[:, None] * b.to(F64)
    return QuadraticAccumulator(m.T @ m, a.to(F64))


def ia3_statistic(side: str, form: str, gram: Tensor, w0: Tensor) -> Tensor:
    """What a client sends of its Gram ``G_i`` (decayed as the run's backbone gamma says) for an (IA)^3
    layer of frozen weight ``W0`` trained on ``side``: the weights of its exact merge, or the Gram itself.

    - ``"B"`` (output), exact: ``e_i = diag(W0 G_i W0^T)``: ``(d_out,)``;
    - ``"B"``, appendix: the Gram ``(d_in,)`` (diagonal only: the rule then needs no ``W0``);
    - ``"A"`` (input), exact: ``H_i = (W0^T W0) o G_i``: ``(d_in,)`` for a diagonal Gram, else ``(d_in, d_in)``.
    """
    w0 = w0.to(F64)
    if side == "B":
        if form == "appendix":
            if gram.dim() != 1:
                raise ValueError("the appendix's (IA)^3 rule needs diagonal Grams (gamma_backbone = 0)")
            return gram.to(F64)
        return (gram_times(w0, gram) * w0).sum(1)
    if gram.dim() == 1:
        return (w0 * w0).sum(0) * gram.to(F64)
    return (w0.T @ w0) * gram.to(F64)


def ia3_accumulator(
    side: str, form: str, d_out: int, d_in: int, full: bool
) -> VectorMeanAccumulator | QuadraticAccumulator | AppendixAccumulator:
    """The running sums of one (IA)^3 layer's merge, from what :func:`ia3_statistic` sends; also the task
    merge, each task's vector weighted by its clients' summed statistics."""
    if side == "B":
        if form == "appendix":  # the rule's division by W0 cancels its product with W0: F = ones
            return AppendixAccumulator(torch.ones(d_out, d_in, dtype=F64))
        return VectorMeanAccumulator(d_out)
    return QuadraticAccumulator(torch.ones(d_in, d_in, dtype=F64)) if full else VectorMeanAccumulator(d_in)


def ia3_statistic_shape(side: str, form: str, d_out: int, d_in: int, full: bool) -> tuple[int, ...]:
    """The shape :func:`ia3_statistic` gives."""
    if side == "B":
        return (d_in,) if form == "appendix" else (d_out,)
    return (d_in, d_in) if full else (d_in,)
