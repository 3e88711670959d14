"""The merges as sums of per-client terms (issue 19): solving from the summed terms gives what the
accumulators give, for full and diagonal Grams, and the B-round's terms are smaller than its inputs."""

from __future__ import annotations

import pytest
import torch

from common.merge import LoraBAccumulator, RegMeanAccumulator, WeightedMeanAccumulator
from common.terms import add, lora_b_terms, mean_terms, regmean_terms, solve_lora_b, solve_mean, solve_regmean

F64 = torch.float64
EPS = torch.finfo(F64).eps


def clients(seed: int, k: int, d_in: int, full: bool):
    g = torch.Generator().manual_seed(seed)
    for _ in range(k):
        x = torch.randn(20, d_in, generator=g, dtype=F64)
        yield g, (x.T @ x if full else (x * x).sum(0))


@pytest.mark.parametrize("full", [True, False])
def test_regmean_and_the_a_round_from_summed_terms(full):
    acc, total = RegMeanAccumulator(3, 6), None
    for g, gram in clients(0, 4, 6, full):
        w = torch.randn(3, 6, generator=g, dtype=F64)
        acc.fold(w, gram)
        total = add(total, regmean_terms(w, gram))
    assert total is not None
    assert torch.allclose(solve_regmean(total), acc.result(), rtol=0, atol=1e4 * EPS)


@pytest.mark.parametrize("full", [True, False])
def test_the_b_round_from_summed_terms(full):
    g0 = torch.Generator().manual_seed(1)
    a = torch.randn(2, 8, generator=g0, dtype=F64)
    acc, total = LoraBAccumulator(a, 5), None
    for g, gram in clients(2, 3, 8, full):
        b = torch.randn(5, 2, generator=g, dtype=F64)
        acc.fold(b, gram)
        terms = lora_b_terms(b, a, gram)
        total = add(total, terms)
    assert total is not None
    assert torch.allclose(solve_lora_b(total), acc.result(), rtol=0, atol=1e4 * EPS)
    sent = sum(t.numel() for t in terms.values())
    assert sent == 5 * 2 + 2 * 2 < 5 * 2 + 8  # fewer numbers than B_i and a diagonal Gram


def test_means_from_summed_terms_and_mismatched_terms_refused():
    acc, total = WeightedMeanAccumulator((4,)), None
    for n, seed in ((3, 0), (7, 1)):
        x = torch.randn(4, generator=torch.Generator().manual_seed(seed), dtype=F64)
        acc.fold(x, n)
        total = add(total, mean_terms(x, n))
    assert total is not None and torch.allclose(solve_mean(total), acc.result(), rtol=0, atol=10 * EPS)
    with pytest.raises(ValueError, match="expected"):
        add(total, {"nx": torch.zeros(4)})
