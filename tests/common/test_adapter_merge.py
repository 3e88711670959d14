"""(IA)^3 and VeRA merges: the exact forms equal a generic least-squares solve; the appendix's
formulas do not when the Grams are not diagonal, and agree with them when every client agrees."""

from __future__ import annotations

from collections.abc import Callable

import pytest
import torch

from common.merges.sums import running_sums, summable
from common.merges.vectors import (
    VectorMeanAccumulator,
    ia3_input,
    ia3_output,
    vera_accumulator,
    vera_b,
    vera_d,
    vera_statistic,
)

F64 = torch.float64
EPS = torch.finfo(F64).eps


def oracle(delta: Callable[[torch.Tensor], torch.Tensor], vectors, xs) -> torch.Tensor:
    """argmin_v sum_i ||dW(v) X_i - dW(v_i) X_i||^2 by least squares over the stacked residuals (dW linear)."""
    p = vectors[0].numel()
    columns = [torch.cat([(delta(e) @ x).flatten() for x in xs]) for e in torch.eye(p, dtype=F64)]
    design = torch.stack(columns, dim=1)
    target = torch.cat([(delta(v) @ x).flatten() for v, x in zip(vectors, xs)])
    return torch.linalg.lstsq(design, target[:, None], driver="gelsd").solution[:, 0]


def setting(seed: int, d_out=5, d_in=7, r=3, k=3, n=12):
    g = torch.Generator().manual_seed(seed)
    xs = [torch.randn(d_in, n, generator=g, dtype=F64) * torch.rand(d_in, 1, generator=g, dtype=F64) for _ in range(k)]
    return g, xs, [x @ x.T for x in xs], d_out, d_in, r, k


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_ia3_output_exact_equals_least_squares_and_the_appendix_differs(seed):
    g, xs, grams, d_out, d_in, _, k = setting(seed)
    w0 = torch.randn(d_out, d_in, generator=g, dtype=F64)
    ls = [torch.randn(d_out, generator=g, dtype=F64) for _ in range(k)]
    exact = ia3_output(ls, grams, w0)
    assert torch.allclose(exact, oracle(lambda v: v[:, None] * w0, ls, xs), rtol=0, atol=1e6 * EPS)
    assert (ia3_output(ls, grams, w0, form="appendix") - exact).abs().max() > 1e-3
    same = [ls[0]] * k  # every client agrees: both forms give that vector
    assert torch.allclose(ia3_output(same, grams, w0, form="appendix"), ls[0], atol=1e6 * EPS)


@pytest.mark.parametrize("seed", [0, 1])
def test_ia3_input_exact_equals_least_squares(seed):
    g, xs, grams, d_out, d_in, _, k = setting(seed)
    w = torch.randn(d_out, d_in, generator=g, dtype=F64)
    ls = [torch.randn(d_in, generator=g, dtype=F64) for _ in range(k)]
    assert torch.allclose(ia3_input(ls, grams, w), oracle(lambda v: w * v[None, :], ls, xs), rtol=0, atol=1e6 * EPS)
    diag = [gr.diagonal() for gr in grams]  # a diagonal Gram is a Gram too
    want = oracle(lambda v: w * v[None, :], ls, [torch.diag(d.sqrt()) for d in diag])
    assert torch.allclose(ia3_input(ls, diag, w), want, rtol=0, atol=1e6 * EPS)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_vera_alternating_rounds_equal_least_squares_and_the_appendix_differs(seed):
    g, xs, grams, d_out, d_in, r, k = setting(seed)
    b = torch.randn(d_out, r, generator=g, dtype=F64)
    a = torch.randn(r, d_in, generator=g, dtype=F64)
    lb = torch.randn(d_out, generator=g, dtype=F64)
    lds = [torch.randn(r, generator=g, dtype=F64) for _ in range(k)]
    projected = [a @ gr @ a.T for gr in grams]  # what a client sends in an ld-round: r x r
    exact_d = vera_d(lds, projected, b, lb)
    assert torch.allclose(exact_d, oracle(lambda v: (lb[:, None] * b) @ (v[:, None] * a), lds, xs), atol=1e6 * EPS)
    appendix_d = vera_d(lds, projected, b, lb, form="appendix", grams=grams, a=a)
    assert (appendix_d - exact_d).abs().max() > 1e-3
    ld = exact_d
    lbs = [torch.randn(d_out, generator=g, dtype=F64) for _ in range(k)]
    exact_b = vera_b(lbs, grams, b, a, ld)
    assert torch.allclose(exact_b, oracle(lambda v: (v[:, None] * b) @ (ld[:, None] * a), lbs, xs), atol=1e6 * EPS)
    assert (vera_b(lbs, grams, b, a, ld, form="appendix") - exact_b).abs().max() > 1e-3


@pytest.mark.parametrize("form", ["exact", "appendix"])
@pytest.mark.parametrize("side", ["B", "A"])
@pytest.mark.parametrize("diagonal", [False, True])
def test_vera_running_sums_equal_the_merges_from_what_clients_send(side, form, diagonal):
    """The coordinator's accumulators, fed each client's vector and its Gram statistic (computed on the
    client's side), give the list-form merges above, which equal least squares: the dense Gram never
    travels, and the sums declare themselves for secure aggregation."""
    g, _, grams, d_out, d_in, r, k = setting(3)
    grams = [gr.diagonal().clone() for gr in grams] if diagonal else grams
    b = torch.randn(d_out, r, generator=g, dtype=F64)
    a = torch.randn(r, d_in, generator=g, dtype=F64)
    lb, ld = torch.randn(d_out, generator=g, dtype=F64), torch.randn(r, generator=g, dtype=F64)
    trained = [torch.randn(d_out if side == "B" else r, generator=g, dtype=F64) for _ in range(k)]
    acc = vera_accumulator(side, form, b, a, lb, ld)
    sent = [vera_statistic(side, form, gr, b, a, lb, ld) for gr in grams]
    gram_shape = tuple(grams[0].shape)
    a_exact = (d_in,) if diagonal and d_in < r * r else (r, r)  # the smaller of the diagonal Gram and A G A^T
    expected = {("B", "exact"): (d_out,), ("A", "exact"): a_exact, ("B", "appendix"): (r, r)}.get(
        (side, form), gram_shape
    )
    assert all(tuple(s.shape) == expected for s in sent)  # never a dense Gram but the appendix's ld rule
    for v, s in zip(trained, sent):
        acc.fold(v, s)
    if side == "B":
        want = vera_b(trained, grams, b, a, ld, form=form)
    else:
        want = vera_d(
            trained,
            [a @ torch.diag(gr) @ a.T if gr.dim() == 1 else a @ gr @ a.T for gr in grams],
            b,
            lb,
            form=form,
            grams=grams,
            a=a,
        )
    assert torch.allclose(acc.result(), want, rtol=1e6 * EPS, atol=1e6 * EPS)
    assert summable(acc) and running_sums(acc)


def test_vector_mean_refuses_negative_weights_and_wrong_shapes():
    acc = VectorMeanAccumulator(3)
    with pytest.raises(ValueError, match="non-negative"):
        acc.fold(torch.ones(3), torch.tensor([1.0, -1.0, 1.0]))
    with pytest.raises(ValueError, match=r"shape \(3,\)"):
        acc.fold(torch.ones(4), torch.ones(4))
    with pytest.raises(ValueError, match="nothing folded"):
        acc.result()
