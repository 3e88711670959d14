"""Closed-form merges of (IA)^3 and VeRA vectors (issue 20; ``../shared/SPEC.md`` §5), exact and as the
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

import torch
from torch import Tensor

from common.merge import gram_times, right_solve

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
