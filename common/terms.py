"""Each closed-form merge as a sum of per-client terms, and its solve from the summed terms.

Secure aggregation (``common/secagg.py``, issue 19) lets the coordinator see only sums. These
are the terms a client would mask, one function per kind of merge; the merge is the same function
of their sums as the accumulators of ``common/merge.py`` compute (they fold exactly these terms):

- RegMean, LoRM's A-round, the head (:func:`regmean_terms`): ``W_i G_i`` and ``G_i``
  (``G_i`` full or its diagonal), solved as ``(sum W_i G_i)(sum G_i)^-1``;
- LoRM's B-round (:func:`lora_b_terms`), ``A`` shared: ``B_i A G_i A^T (d_out, r)`` and
  ``A G_i A^T (r, r)``: fewer numbers than ``B_i`` and a diagonal Gram when ``r^2 < d_in``;
- sample-weighted means (:func:`mean_terms`: FedAvg, heads' bias): ``n_i x_i`` and ``n_i``.

Feature statistics (class sums, counts, Grams, CCVR's second moments) are sums already.
"""

from __future__ import annotations

import torch
from torch import Tensor

from common.merge import gram_times, right_solve

Terms = dict[str, Tensor]


def regmean_terms(w: Tensor, g: Tensor) -> Terms:
    """``{"wg": W G (d_out, d_in), "g": G}``, float64."""
    return {"wg": gram_times(w, g), "g": g.to(torch.float64)}


def solve_regmean(sums: Terms) -> Tensor:
    """``(sum W_i G_i)(sum G_i)^-1``."""
    return right_solve(sums["wg"], sums["g"])


def lora_b_terms(b: Tensor, a: Tensor, g: Tensor) -> Terms:
    """``{"bagat": B A G A^T (d_out, r), "agat": A G A^T (r, r)}`` for the shared ``A (r, d_in)``, float64."""
    agat = gram_times(a, g) @ a.to(torch.float64).T
    return {"bagat": b.to(torch.float64) @ agat, "agat": agat}


def solve_lora_b(sums: Terms) -> Tensor:
    """``B = (sum B_i A G_i A^T)(A (sum G_i) A^T)^-1``."""
    return right_solve(sums["bagat"], sums["agat"])


def mean_terms(x: Tensor, n: float) -> Terms:
    """``{"nx": n x, "n": n}``, float64."""
    return {"nx": x.to(torch.float64) * float(n), "n": torch.tensor(float(n), dtype=torch.float64)}


def solve_mean(sums: Terms) -> Tensor:
    """``sum n_i x_i / sum n_i``."""
    return sums["nx"] / sums["n"]


def add(total: Terms | None, terms: Terms) -> Terms:
    """``total + terms`` name by name (``total`` ``None``: the first client's terms)."""
    if total is None:
        return {name: t.clone() for name, t in terms.items()}
    if total.keys() != terms.keys():
        raise ValueError(f"terms: expected {sorted(total)}, got {sorted(terms)}")
    return {name: total[name] + terms[name] for name in total}
