"""What a client update must satisfy before anything is folded into a merge: one place for every method.

Each aggregator declares the tensors its step expects as ``wire name -> shape``
(:func:`factor_shapes`, :func:`gram_shapes`, ...; wire names as in :mod:`common.wire.tensors`), and
:func:`check_tensors` holds an update to it: exactly those names, those shapes, the dtype of
the tensor's kind, and the values its kind allows. :func:`check_declared` applies the same
names, shapes, dtypes and a byte limit to a push's declared headers, before any byte of it
is received.

Dtypes (what clients compute, what the wire carries without rounding): parameters (LoRA
factors, the head's weight and bias, backbone deltas) are float32, the precision of the
plans and of the clients' models; float64 (the strategies' own precision) is accepted too,
as folding it loses nothing. Statistics (Grams, Fisher, feature statistics) are float64,
as clients accumulate them; anything else is refused.

A dimension may be an :class:`UpTo` bound instead of a size: a Gram factor ``R`` with
``R^T R = X^T X`` has ``min(samples, width)`` rows, whatever its client's sample count.

Values: every entry finite; Gram diagonals non-negative; a full Gram ``(d, d)`` symmetric
within ``SYMMETRY_RTOL * max(diag)`` and positive semidefinite within ``PSD_RTOL * trace``
(a Cholesky of ``G + PSD_RTOL * trace * I``: 0.04 s at d = 768, about 3 s at d = 5000 on one
core); Fisher non-negative; class counts non-negative whole numbers.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import torch
from torch import Tensor

from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    STAT,
    UpTo,  # noqa: F401 (UpTo: re-exported)
    parse_tensor_name,
    shape_fits,
)

PARAM_DTYPES = (torch.float32, torch.float64)  # factors, head, deltas: float32 as clients compute; float64 lossless
STAT_DTYPES = (torch.float64,)  # Grams, Fisher, feature statistics: accumulated in float64 by clients
SYMMETRY_RTOL = 1e-9  # |G - G^T| <= this * max(diag G): float64 rounding of X^T X is ~1e-16
PSD_RTOL = 1e-8  # lambda_min(G) >= -this * trace(G): far above rounding, far below any real indefiniteness
MAX_DTYPE_BYTES = 8  # the widest accepted dtype: bounds a step's submission size


class UpdateRejected(ValueError):
    """A client update that does not fit the step it claims to answer; ``field`` names what."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


# ------------------------------------------------------------------ what a step expects


def max_bytes(expected: dict[str, tuple[int, ...]]) -> int:
    """The most tensor bytes an update of this step can carry (every tensor in the widest dtype)."""
    return sum(math.prod(shape) for shape in expected.values()) * MAX_DTYPE_BYTES


# ------------------------------------------------------------------ names and fields


def field_of(name: str) -> str:
    """What a refusal names for a tensor: its wire name (``factor/<layer>/B``, ``gram/<layer>``, ``head/weight``)."""
    return name


def _group_of(name: str) -> str:
    """The kind of a wire name (``factor``, ``gram``, ``stat``, ...; the head's tensors by name)."""
    kind, _, part = parse_tensor_name(name)
    return name if kind == "head" else kind


def _allowed_dtypes(name: str) -> tuple[torch.dtype, ...]:
    kind, _, part = parse_tensor_name(name)
    return PARAM_DTYPES if kind in (FACTOR, DELTA) or (kind == "head" and part != "gram") else STAT_DTYPES


def _check_names(got: Iterable[str], expected: dict[str, tuple[int, ...]]) -> None:
    got = set(got)
    if got == set(expected):
        return
    missing, unknown = sorted(set(expected) - got), sorted(got - set(expected))
    first = min(missing + unknown, key=lambda n: (list(expected).index(n) if n in expected else len(expected), n))
    group = _group_of(first) if first in expected or _parses(first) else "tensors"
    raise UpdateRejected(
        group, f"this step expects {len(expected)} tensors; missing {missing[:3]}, unexpected {unknown[:3]}"
    )


def _parses(name: str) -> bool:
    try:
        parse_tensor_name(name)
    except ValueError:
        return False
    return True


def _dtype_message(dtype: object, allowed: tuple[torch.dtype, ...]) -> str:
    names = " or ".join(str(d).removeprefix("torch.") for d in allowed)
    return f"expected dtype {names}, got {str(dtype).removeprefix('torch.')}"


# ------------------------------------------------------------------ checks


def check_declared(
    declared: dict[str, tuple[str, tuple[int, ...]]], expected: dict[str, tuple[int, ...]], nbytes: int
) -> None:
    """A push's headers (``name -> (dtype name, shape)``, ``nbytes`` in all) against the step, before its bytes."""
    limit = max_bytes(expected)
    if nbytes > limit:
        raise UpdateRejected(
            "tensors.nbytes",
            f"the push declares {nbytes} bytes; this step's update is at most "
            f"{limit} bytes (its expected tensors in float64)",
        )
    _check_names(declared, expected)
    for name, (dtype, shape) in declared.items():
        if not shape_fits(tuple(shape), expected[name]):
            raise UpdateRejected(field_of(name), f"expected shape {expected[name]}, got {tuple(shape)}")
        allowed = _allowed_dtypes(name)
        if dtype not in (str(d).removeprefix("torch.") for d in allowed):
            raise UpdateRejected(field_of(name), _dtype_message(dtype, allowed))


def check_tensors(tensors: dict[str, Tensor], expected: dict[str, tuple[int, ...]]) -> None:
    """Names, shapes, dtypes and values of an update's tensors (wire names) against the step's."""
    _check_names(tensors, expected)
    for name, want in expected.items():
        t, field = tensors[name], field_of(name)
        if not shape_fits(tuple(t.shape), want):
            raise UpdateRejected(field, f"expected shape {want}, got {tuple(t.shape)}")
        if t.dtype not in _allowed_dtypes(name):
            raise UpdateRejected(field, _dtype_message(t.dtype, _allowed_dtypes(name)))
        check_finite(field, t)
        kind, layer, part = parse_tensor_name(name)
        stat = layer or "" if kind == STAT else ""
        if kind == GRAM or part == "gram" or stat.endswith("gram"):
            check_gram(field, t)
        elif kind == FISHER:
            check_non_negative(field, t)
        elif stat.endswith("class_count"):
            check_counts(field, t)


def check_finite(field: str, t: Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        bad = int((~torch.isfinite(t)).sum())
        raise UpdateRejected(field, f"must be finite, got {bad} NaN or inf entries")


def check_non_negative(field: str, t: Tensor) -> None:
    if t.numel() and bool((t < 0).any()):
        raise UpdateRejected(field, f"must be non-negative, got minimum {float(t.min())}")


def check_counts(field: str, t: Tensor) -> None:
    check_non_negative(field, t)
    if not torch.equal(t, t.round()):
        raise UpdateRejected(field, "counts must be whole numbers")


def check_gram(field: str, g: Tensor) -> None:
    """A Gram ``X^T X`` (``(d, d)``) or its diagonal (``(d,)``): finite entries assumed checked."""
    diag = g if g.dim() == 1 else torch.diagonal(g)
    if diag.numel() and bool((diag < 0).any()):
        raise UpdateRejected(field, f"a Gram's diagonal must be non-negative, got minimum {float(diag.min())}")
    if g.dim() == 1 or g.shape[0] == 0:
        return
    scale = float(diag.max())
    asym = float((g - g.T).abs().max())
    if asym > SYMMETRY_RTOL * scale:
        raise UpdateRejected(
            field,
            f"a full Gram must be symmetric: |G - G^T| reaches {asym:.3g}, "
            f"over {SYMMETRY_RTOL:g} x max diagonal {scale:.3g}",
        )
    eps = PSD_RTOL * max(float(diag.sum()), torch.finfo(torch.float64).tiny)
    shifted = g.to(torch.float64) + eps * torch.eye(g.shape[0], dtype=torch.float64)
    _, info = torch.linalg.cholesky_ex(shifted)
    if int(info) != 0:
        raise UpdateRejected(
            field,
            f"a full Gram must be positive semidefinite: G + {eps:.3g} I ({PSD_RTOL:g} x trace) has no Cholesky factor",
        )


def check_scalars(num_samples: int, train_loss: float, samples: tuple[int, int] | None = None) -> None:
    """``num_samples`` within ``samples = (lo, hi)`` (by default ``>= 0``: a client on its own data may hold
    none of a task's classes; the coordinator gives the run's bounds); ``train_loss`` NaN or finite >= 0.

    A NaN loss means "not measured" (Gram passes, features steps, zero local epochs, no samples);
    cross entropy is never negative.
    """
    lo, hi = samples or (0, None)
    if num_samples < max(lo, 0) or (hi is not None and num_samples > hi):
        within = f"in [{max(lo, 0)}, {hi}]" if hi is not None else f">= {max(lo, 0)}"
        raise UpdateRejected("num_samples", f"expected a sample count {within}, got {num_samples}")
    if not math.isnan(train_loss) and not (math.isfinite(train_loss) and train_loss >= 0):
        raise UpdateRejected("train_loss", f"expected NaN (not measured) or a finite loss >= 0, got {train_loss}")
