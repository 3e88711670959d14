"""Float tolerances derived from the dtype and the size of the computation, not from one CPU's kernels.

Two CPUs (or two batchings on one) may round a float32 matrix product differently: the results
agree to a few units of the dtype's roundoff ``eps``, scaled by how many rounded terms enter
each result and by how much a later solve amplifies them (its condition number). A test that
compares such results allows exactly that much, with a stated safety factor.
"""

from __future__ import annotations

import math

import torch

SAFETY = 8.0  # headroom over the first-order bound; still orders of magnitude below a real bug


def rel_tolerance(dtype: torch.dtype, *, terms: int = 1, cond: float = 1.0, safety: float = SAFETY) -> float:
    """``safety * eps(dtype) * sqrt(terms) * cond``: the relative error of ``terms`` rounded terms summed,
    then amplified by a solve of condition number ``cond``."""
    return safety * torch.finfo(dtype).eps * math.sqrt(max(terms, 1)) * max(cond, 1.0)


def assert_close_to_dtype(actual: torch.Tensor, expected: torch.Tensor, dtype: torch.dtype, **bound) -> None:
    """``|actual - expected| <= tol * max|expected|`` elementwise, ``tol = rel_tolerance(dtype, **bound)``."""
    tol = rel_tolerance(dtype, **bound)
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    torch.testing.assert_close(actual, expected, rtol=tol, atol=tol * max(scale, torch.finfo(dtype).tiny))
