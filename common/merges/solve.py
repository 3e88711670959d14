"""The least-squares solve every closed-form merge ends in (docs/METHOD.md §2): pure functions, float64 inside.

A Gram is passed either as a full matrix ``G: (d_in, d_in)`` or as a vector ``g: (d_in,)`` meaning the diagonal
Gram ``diag(g)``. Solves never form an explicit inverse. Input columns whose total Gram is zero, or below
``d * eps`` of the largest diagonal entry (dead inputs), give zero columns in the result, as a pseudo-inverse
would; a full Gram that is singular on its support falls back to the pseudo-inverse, ``M pinv(S)``: the
minimum-norm minimiser, as in the reference implementation. Here too the shape checks and the float64 cast its
siblings share: the Gram statistics (:mod:`common.merges.grams`), RegMean's and LoRM's merges
(:mod:`common.merges.regmean`), the vector merges (:mod:`common.merges.vectors`) and the ridge head
(``server/strategies/closed_form.py``) all solve with :func:`right_solve`.
"""

from __future__ import annotations

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
