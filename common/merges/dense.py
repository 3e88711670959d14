"""Merges of dense task vectors for the full fine-tuning baselines: Fisher averaging and TIES.

Pure math, float64 inside, like :mod:`common.merges.regmean` (whose RegMean and weighted mean the
baselines reuse). A *task vector* here is one client's update of one round: a named set of
tensors ``name -> delta`` (trained minus starting weights). Both merges fold one client at a
time into running sums whose size does not depend on how many clients were folded.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import ClassVar

import torch
from torch import Tensor

from common.merges.regmean import WeightedMeanAccumulator
from common.merges.solve import DTYPE


def _f64(x: Tensor) -> Tensor:
    return x.detach().to(DTYPE)


@dataclass
class FisherMeanAccumulator:
    """Fisher-weighted mean ``x = sum_i F_i * x_i / sum_i F_i``, element-wise.

    ``x_i`` and ``F_i`` (a diagonal Fisher, non-negative) share one ``shape``. Where
    ``sum_i F_i = 0`` (no client's loss depends on the entry) the quotient is undefined and the
    sample-weighted mean ``sum_i n_i x_i / sum_i n_i`` is used instead.
    """

    SUMS: ClassVar[tuple[str, ...]] = ("numerator", "fisher")  # running sums (common/merges/sums.py)
    PARTS: ClassVar[tuple[str, ...]] = ("fallback",)

    shape: tuple[int, ...]
    numerator: Tensor | None = None  # sum_i F_i * x_i
    fisher: Tensor | None = None  # sum_i F_i
    fallback: WeightedMeanAccumulator = field(init=False)

    def __post_init__(self) -> None:
        self.fallback = WeightedMeanAccumulator(self.shape)

    def fold(self, x: Tensor, fisher: Tensor, n: float) -> None:
        if tuple(x.shape) != tuple(self.shape) or tuple(fisher.shape) != tuple(self.shape):
            raise ValueError(
                f"fisher mean: expected shape {tuple(self.shape)}, got x {tuple(x.shape)} "
                f"and fisher {tuple(fisher.shape)}"
            )
        self.fallback.fold(x, n)
        f = _f64(fisher)
        term = f * _f64(x)
        self.numerator = term if self.numerator is None else self.numerator + term
        self.fisher = f.clone() if self.fisher is None else self.fisher + f

    def result(self) -> Tensor:
        if self.numerator is None or self.fisher is None:
            raise ValueError("FisherMeanAccumulator: nothing folded yet")
        alive = self.fisher > 0
        safe = torch.where(alive, self.fisher, torch.ones_like(self.fisher))
        return torch.where(alive, self.numerator / safe, self.fallback.result())


def trim_threshold(vector: Mapping[str, Tensor], density: float) -> float:
    """The magnitude of the ``k``-th largest entry of the whole (flattened) vector, ``k = int(density * d)``.

    ``d`` counts the entries of all tensors together; ``k`` is clamped to ``[1, d]``. Keeping the
    entries with ``|x| >= threshold`` keeps the top ``density`` fraction (and any entries tied
    with the threshold, as the TIES reference does).
    """
    if not 0.0 < density <= 1.0:
        raise ValueError(f"density must lie in (0, 1], got {density}")
    magnitudes = torch.cat([_f64(t).abs().flatten() for t in vector.values()])
    d = magnitudes.numel()
    if d == 0:
        raise ValueError("trim_threshold: the vector has no entries")
    k = min(max(int(density * d), 1), d)
    return float(torch.kthvalue(magnitudes, d - k + 1).values)


@dataclass
class TiesAccumulator:
    """TIES-Merging (Yadav et al., 2023) of task vectors ``tau_i``, folded one at a time.

    For each client: *trim* ``tau_i`` to its top ``density`` entries by magnitude over the whole
    vector (the rest become 0). After all clients: *elect* a sign per entry,
    ``s = sign(sum_i trim(tau_i))``, and take the *disjoint mean* over the clients whose trimmed
    entry is non-zero with sign ``s``. The running sums are split by sign,
    ``S+ = sum of positive entries``, ``C+ = their count`` (and ``S-``, ``C-``), so that
    ``sum_i trim(tau_i) = S+ + S-`` and the disjoint mean is ``S+ / C+`` or ``S- / C-``.

    Ties ``S+ + S- = 0`` take the majority sign ``sign(sum over all entries of s)``, as the TIES
    reference does (and its negative branch when that too is 0). Entries no client kept give 0.
    The scale ``lambda`` is the caller's. Shapes: ``shapes[name]`` for every tensor of the vector.
    """

    shapes: dict[str, tuple[int, ...]]
    density: float = 0.3
    pos_sum: dict[str, Tensor] = field(init=False)
    pos_count: dict[str, Tensor] = field(init=False)
    neg_sum: dict[str, Tensor] = field(init=False)
    neg_count: dict[str, Tensor] = field(init=False)
    count: int = 0

    def __post_init__(self) -> None:
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"density must lie in (0, 1], got {self.density}")
        self.pos_sum, self.neg_sum = self._zeros(DTYPE), self._zeros(DTYPE)
        self.pos_count, self.neg_count = self._zeros(torch.int32), self._zeros(torch.int32)

    def _zeros(self, dtype: torch.dtype) -> dict[str, Tensor]:
        return {name: torch.zeros(shape, dtype=dtype) for name, shape in self.shapes.items()}

    def fold(self, vector: Mapping[str, Tensor]) -> None:
        if set(vector) != set(self.shapes):
            raise ValueError(f"ties: expected tensors {sorted(self.shapes)}, got {sorted(vector)}")
        for name, t in vector.items():
            if tuple(t.shape) != tuple(self.shapes[name]):
                raise ValueError(f"ties: {name} should have shape {tuple(self.shapes[name])}, got {tuple(t.shape)}")
        threshold = trim_threshold(vector, self.density)
        for name, t in vector.items():
            x = _f64(t)
            kept = torch.where(x.abs() >= threshold, x, torch.zeros_like(x))
            self.pos_sum[name] += kept.clamp(min=0.0)
            self.neg_sum[name] += kept.clamp(max=0.0)
            self.pos_count[name] += (kept > 0).to(torch.int32)
            self.neg_count[name] += (kept < 0).to(torch.int32)
        self.count += 1

    def result(self) -> dict[str, Tensor]:
        """The disjoint mean per entry (before scaling), float64, one tensor per name."""
        if self.count == 0:
            raise ValueError("TiesAccumulator: nothing folded yet")
        elected = {n: torch.sign(self.pos_sum[n] + self.neg_sum[n]) for n in self.shapes}
        total = sum(float(s.sum()) for s in elected.values())
        majority = float((total > 0) - (total < 0))
        out = {}
        for name, s in elected.items():
            s = torch.where(s == 0, torch.full_like(s, majority), s)
            pos = self.pos_sum[name] / self.pos_count[name].clamp(min=1)
            neg = self.neg_sum[name] / self.neg_count[name].clamp(min=1)
            out[name] = torch.where(s > 0, pos, neg)
        return out
