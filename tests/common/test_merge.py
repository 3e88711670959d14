"""The closed forms of common/merges/regmean.py are exact least-squares minimisers (docs/METHOD.md §2).

Each merge is checked against an independent generic solve: the per-client problems are
stacked into one ``torch.linalg.lstsq`` in float64. Client ``i`` is described by its input
rows ``X_i: (n_i, d_in)`` (``G_i = X_i^T X_i``); a diagonal Gram ``g_i`` is the same thing
with ``X_i = diag(sqrt(g_i))``. Where the minimiser is unique the matrices must match;
where it is not (rank-deficient inputs) the objective value and the predictions must match.
In every case the autograd gradient of the objective must vanish at the closed form.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import Tensor

from common.merges.grams import GramSum, decay_gram
from common.merges.regmean import (
    LoraAAccumulator,
    LoraBAccumulator,
    RegMeanAccumulator,
    TaskMergeAccumulator,
    WeightedMeanAccumulator,
    merge_lora_a,
    merge_lora_b,
    merge_tasks,
    regmean,
    weighted_mean,
)

from tolerance import assert_close_to_dtype

F64 = torch.float64
FEW = settings(max_examples=12, deadline=None, derandomize=True)
SEEDS = st.integers(0, 2**31 - 1)
FULL_RANK_KINDS = ("full", "diag")
RANK_DEFICIENT_KINDS = ("fewrows", "dupcol")

# ----------------------------------------------------------------------------- data


def randn(gen: torch.Generator, *shape: int) -> Tensor:
    return torch.randn(*shape, generator=gen, dtype=F64)


def randn_list(gen: torch.Generator, n: int, *shape: int) -> list[Tensor]:
    return [randn(gen, *shape) for _ in range(n)]


def make_inputs(gen: torch.Generator, n: int, d_in: int, kind: str) -> tuple[list[Tensor], list[Tensor]]:
    """``n`` clients' input rows ``X_i`` and the Gram each passes to a merge.

    full: ``2 d_in + 3`` Gaussian rows per client (full-rank ``G_i``), with a per-client scale
    so that clients differ; diag: a positive vector ``g_i``; fewrows: one row per client, so
    ``sum_i G_i`` has rank ``n < d_in``; dupcol: like full but column 1 repeats column 0.
    """
    xs, gs = [], []
    for _ in range(n):
        if kind == "diag":
            client_scale = 10 ** (2 * torch.rand(1, generator=gen).item())
            g = (torch.rand(d_in, generator=gen, dtype=F64) + 0.05) * client_scale
            xs.append(torch.diag(g.sqrt()))
            gs.append(g)
            continue
        rows = 1 if kind == "fewrows" else 2 * d_in + 3
        x = randn(gen, rows, d_in) * randn(gen, 1, d_in).abs().add(0.1)
        if kind == "dupcol":
            x[:, 1] = x[:, 0]
        xs.append(x)
        gs.append(x.T @ x)
    return xs, gs


# ----------------------------------------------------------------------------- checks


def lstsq_weights(xs: Sequence[Tensor], ws: Sequence[Tensor]) -> Tensor:
    """Min-norm ``W`` of ``sum_i ||X_i W^T - X_i W_i^T||^2`` by one stacked generic solve."""
    stacked_x = torch.cat(list(xs))
    stacked_y = torch.cat([x @ w.T for x, w in zip(xs, ws)])
    return torch.linalg.lstsq(stacked_x, stacked_y, driver="gelsd").solution.T


def regression_objective(xs: Sequence[Tensor], ws: Sequence[Tensor]) -> Callable[[Tensor], Tensor]:
    return lambda w: sum(((x @ (w - wi).T) ** 2).sum() for x, wi in zip(xs, ws))


def grad_at(objective: Callable[[Tensor], Tensor], w: Tensor) -> Tensor:
    w = w.detach().clone().requires_grad_(True)
    (grad,) = torch.autograd.grad(objective(w), w)
    return grad


def assert_least_squares(
    sol: Tensor,
    ref: Tensor,
    objective: Callable[[Tensor], Tensor],
    predict: Callable[[Tensor], Sequence[Tensor]],
    *,
    unique: bool,
    tol: float = 1e-9,
) -> None:
    """``sol`` minimises ``objective`` as well as the generic solution ``ref`` does."""
    assert sol.dtype == F64 and sol.shape == ref.shape
    assert torch.isfinite(sol).all()
    if unique:
        torch.testing.assert_close(sol, ref, rtol=0, atol=tol * max(ref.abs().max().item(), 1.0))
    zero = torch.zeros_like(ref)
    # Objective at 0 and gradient at 0 set the scale of the terms that cancel at a minimum.
    obj_scale = objective(zero).item()
    assert abs(objective(sol).item() - objective(ref).item()) <= tol * obj_scale
    preds_sol, preds_ref = predict(sol), predict(ref)
    pred_scale = max(p.abs().max().item() for p in preds_ref)
    for p_sol, p_ref in zip(preds_sol, preds_ref):
        torch.testing.assert_close(p_sol, p_ref, rtol=0, atol=10 * tol * pred_scale)
    grad_scale = grad_at(objective, zero).norm().item()
    assert grad_at(objective, sol).norm().item() <= tol * grad_scale


def check_regmean(gen: torch.Generator, n: int, d_out: int, d_in: int, kind: str) -> None:
    xs, gs = make_inputs(gen, n, d_in, kind)
    ws = randn_list(gen, n, d_out, d_in)
    sol = regmean(ws, gs)
    objective = regression_objective(xs, ws)
    assert_least_squares(
        sol,
        lstsq_weights(xs, ws),
        objective,
        lambda w: [x @ w.T for x in xs],
        unique=kind in FULL_RANK_KINDS,
        tol=1e-9 if kind in FULL_RANK_KINDS else 1e-7,
    )


def check_lora_b(gen: torch.Generator, n: int, d_out: int, d_in: int, r: int, kind: str) -> None:
    xs, gs = make_inputs(gen, n, d_in, kind)
    a = randn(gen, r, d_in)
    bs = randn_list(gen, n, d_out, r)
    sol = merge_lora_b(bs, a, gs)
    # B-round as a regression on the projected inputs Z_i = X_i A^T: (n_i, r).
    zs = [x @ a.T for x in xs]
    unique = kind in FULL_RANK_KINDS and r <= d_in
    assert_least_squares(
        sol,
        lstsq_weights(zs, bs),
        regression_objective(zs, bs),
        lambda b: [z @ b.T for z in zs],
        unique=unique,
        tol=1e-9 if unique else 1e-7,
    )


def check_lora_a(gen: torch.Generator, n: int, d_out: int, d_in: int, r: int, kind: str) -> None:
    xs, gs = make_inputs(gen, n, d_in, kind)
    b = randn(gen, d_out, r)  # shared, full column rank (d_out >= r)
    as_ = randn_list(gen, n, r, d_in)
    sol = merge_lora_a(as_, gs)
    ref = lstsq_weights(xs, as_)  # spec's form: sum_i ||A X_i^T - A_i X_i^T||^2
    unique = kind in FULL_RANK_KINDS
    tol = 1e-9 if unique else 1e-7
    assert_least_squares(
        sol, ref, regression_objective(xs, as_), lambda a: [x @ a.T for x in xs], unique=unique, tol=tol
    )

    # The true A-round objective, with the shared B in front: also minimised there.
    def true_objective(a: Tensor) -> Tensor:
        return sum(((x @ (a - ai).T @ b.T) ** 2).sum() for x, ai in zip(xs, as_))

    assert_least_squares(sol, ref, true_objective, lambda a: [x @ a.T @ b.T for x in xs], unique=unique, tol=tol)


def check_tasks(gen: torch.Generator, rs: Sequence[int], d_out: int, d_in: int, kind: str) -> None:
    xs, gs = make_inputs(gen, len(rs), d_in, kind)
    bs = [randn(gen, d_out, r) for r in rs]
    as_ = [randn(gen, r, d_in) for r in rs]
    b_cat, a_cat = merge_tasks(bs, as_, gs)
    assert b_cat.shape == (d_out, sum(rs)) and a_cat.shape == (sum(rs), d_in)
    assert torch.equal(b_cat, torch.cat(bs, dim=1))
    targets = [b @ a for b, a in zip(bs, as_)]
    unique = kind in FULL_RANK_KINDS
    assert_least_squares(
        b_cat @ a_cat,
        lstsq_weights(xs, targets),
        regression_objective(xs, targets),
        lambda w: [x @ w.T for x in xs],
        unique=unique,
        tol=1e-9 if unique else 1e-7,
    )


# ----------------------------------------------------------------------------- exactness


@FEW
@given(st.integers(1, 4), st.integers(1, 6), st.integers(1, 8), st.sampled_from(FULL_RANK_KINDS), SEEDS)
def test_regmean_is_least_squares(n: int, d_out: int, d_in: int, kind: str, seed: int) -> None:
    check_regmean(torch.Generator().manual_seed(seed), n, d_out, d_in, kind)


@FEW
@given(
    st.integers(1, 4), st.integers(1, 6), st.integers(1, 4), st.integers(0, 4), st.sampled_from(FULL_RANK_KINDS), SEEDS
)
def test_lora_b_is_least_squares(n: int, d_out: int, r: int, extra: int, kind: str, seed: int) -> None:
    check_lora_b(torch.Generator().manual_seed(seed), n, d_out, r + extra, r, kind)


@FEW
@given(
    st.integers(1, 4), st.integers(1, 4), st.integers(0, 3), st.integers(1, 8), st.sampled_from(FULL_RANK_KINDS), SEEDS
)
def test_lora_a_is_least_squares(n: int, r: int, extra: int, d_in: int, kind: str, seed: int) -> None:
    check_lora_a(torch.Generator().manual_seed(seed), n, r + extra, d_in, r, kind)


@FEW
@given(
    st.lists(st.integers(1, 4), min_size=1, max_size=4),
    st.integers(1, 6),
    st.integers(1, 8),
    st.sampled_from(FULL_RANK_KINDS),
    SEEDS,
)
def test_task_merge_is_least_squares(rs: list[int], d_out: int, d_in: int, kind: str, seed: int) -> None:
    check_tasks(torch.Generator().manual_seed(seed), rs, d_out, d_in, kind)


@pytest.mark.parametrize("kind", RANK_DEFICIENT_KINDS)
@pytest.mark.parametrize("seed", [0, 1])
def test_rank_deficient_inputs_still_minimise(kind: str, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    check_regmean(gen, 3, 5, 9, kind)
    check_lora_b(gen, 3, 5, 9, 4, kind)
    check_lora_a(gen, 3, 5, 9, 4, kind)
    check_tasks(gen, [1, 3, 2], 5, 9, kind)


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
def test_lora_b_with_rank_above_d_in_still_minimises(kind: str) -> None:
    # A S A^T (r x r) then has rank d_in < r: the B-round minimiser is not unique.
    check_lora_b(torch.Generator().manual_seed(3), 3, 4, 3, 5, kind)


@pytest.mark.parametrize("r", [1, 16])
def test_larger_shapes(r: int) -> None:
    gen = torch.Generator().manual_seed(7)
    check_regmean(gen, 5, 48, 32, "full")
    check_lora_b(gen, 5, 48, 32, r, "full")
    check_lora_a(gen, 5, 48, 32, r, "diag")
    check_tasks(gen, [r, 2, r], 48, 32, "full")


def test_checks_reject_the_plain_mean() -> None:
    # The checks above can fail: FedAvg's plain mean is not the minimiser for unequal Grams.
    gen = torch.Generator().manual_seed(11)
    xs, gs = make_inputs(gen, 3, 6, "full")
    ws = randn_list(gen, 3, 4, 6)
    objective = regression_objective(xs, ws)
    with pytest.raises(AssertionError):
        assert_least_squares(
            torch.stack(ws).mean(0), lstsq_weights(xs, ws), objective, lambda w: [x @ w.T for x in xs], unique=False
        )


# ----------------------------------------------------------------------------- special cases


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
def test_one_client_or_task_returns_itself(kind: str) -> None:
    gen = torch.Generator().manual_seed(5)
    _, (g,) = make_inputs(gen, 1, 7, kind)
    w, b, a = randn(gen, 5, 7), randn(gen, 5, 3), randn(gen, 3, 7)
    atol = 1e-10
    torch.testing.assert_close(regmean([w], [g]), w, rtol=0, atol=atol)
    torch.testing.assert_close(merge_lora_b([b], a, [g]), b, rtol=0, atol=atol)
    torch.testing.assert_close(merge_lora_a([a], [g]), a, rtol=0, atol=atol)
    b_cat, a_cat = merge_tasks([b], [a], [g])
    assert torch.equal(b_cat, b)
    torch.testing.assert_close(a_cat, a, rtol=0, atol=atol)


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
def test_identical_grams_give_the_plain_mean(kind: str) -> None:
    gen = torch.Generator().manual_seed(6)
    _, (g,) = make_inputs(gen, 1, 7, kind)
    gs = [g] * 4
    ws, bs = randn_list(gen, 4, 5, 7), randn_list(gen, 4, 5, 3)
    as_ = randn_list(gen, 4, 3, 7)
    mean = lambda ts: torch.stack(ts).mean(0)  # noqa: E731
    torch.testing.assert_close(regmean(ws, gs), mean(ws), rtol=0, atol=1e-10)
    torch.testing.assert_close(merge_lora_b(bs, as_[0], gs), mean(bs), rtol=0, atol=1e-10)
    torch.testing.assert_close(merge_lora_a(as_, gs), mean(as_), rtol=0, atol=1e-10)
    b_cat, a_cat = merge_tasks(bs, as_, gs)
    torch.testing.assert_close(b_cat @ a_cat, mean([b @ a for b, a in zip(bs, as_)]), rtol=0, atol=1e-10)


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
@pytest.mark.parametrize("dead", [[2], [0, 4], list(range(6))])
def test_dead_input_columns_give_zero_columns(kind: str, dead: list[int]) -> None:
    gen = torch.Generator().manual_seed(8)
    xs, gs = make_inputs(gen, 3, 6, kind)
    for x, g in zip(xs, gs):
        x[:, dead] = 0.0
        if kind == "diag":
            g[dead] = 0.0
        else:
            g.copy_(x.T @ x)
    ws, bs = randn_list(gen, 3, 4, 6), randn_list(gen, 3, 4, 2)
    as_ = randn_list(gen, 3, 2, 6)
    b_cat, a_cat = merge_tasks(bs, as_, gs)
    for out, ref in [
        (regmean(ws, gs), lstsq_weights(xs, ws)),
        (merge_lora_a(as_, gs), lstsq_weights(xs, as_)),
        (b_cat @ a_cat, lstsq_weights(xs, [b @ a for b, a in zip(bs, as_)])),
    ]:
        assert torch.isfinite(out).all()
        assert torch.equal(out[:, dead], torch.zeros_like(out[:, dead]))
        # Elsewhere the minimiser is unique; lstsq's minimum-norm solution is 0 on dead columns too.
        torch.testing.assert_close(out, ref, rtol=0, atol=1e-9 * max(ref.abs().max().item(), 1.0))


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
def test_lora_b_dead_rank_direction_gives_zero_column(kind: str) -> None:
    # A zero row of the shared A makes A S A^T singular: that column of B gets no signal.
    gen = torch.Generator().manual_seed(9)
    xs, gs = make_inputs(gen, 3, 6, kind)
    a = randn(gen, 3, 6)
    a[1] = 0.0
    bs = randn_list(gen, 3, 4, 3)
    out = merge_lora_b(bs, a, gs)
    assert torch.isfinite(out).all()
    assert torch.equal(out[:, 1], torch.zeros(4, dtype=F64))
    zs = [x @ a.T for x in xs]
    torch.testing.assert_close(out, lstsq_weights(zs, bs), rtol=0, atol=1e-9 * 10)


def test_diagonal_and_full_code_paths_agree() -> None:
    # A vector g and the matrix diag(g) are the same Gram; mixing both kinds is allowed too.
    gen = torch.Generator().manual_seed(10)
    _, gs = make_inputs(gen, 3, 5, "diag")
    full = [torch.diag(g) for g in gs]
    mixed = [gs[0], full[1], gs[2]]
    ws, bs = randn_list(gen, 3, 4, 5), randn_list(gen, 3, 4, 2)
    as_ = randn_list(gen, 3, 2, 5)
    for grams in (full, mixed):
        close = lambda x, y: torch.testing.assert_close(x, y, rtol=1e-12, atol=1e-12)  # noqa: E731
        close(regmean(ws, grams), regmean(ws, gs))
        close(merge_lora_b(bs, as_[0], grams), merge_lora_b(bs, as_[0], gs))
        close(merge_lora_a(as_, grams), merge_lora_a(as_, gs))
        close(torch.matmul(*merge_tasks(bs, as_, grams)), torch.matmul(*merge_tasks(bs, as_, gs)))


def test_float32_inputs_are_merged_in_float64() -> None:
    gen = torch.Generator().manual_seed(12)
    xs, gs = make_inputs(gen, 2, 4, "full")
    ws = randn_list(gen, 2, 3, 4)
    out = regmean([w.float() for w in ws], [g.float() for g in gs])
    assert out.dtype == F64
    # apart by the weights' one rounding to float32, through the solve with the summed Gram
    cond = float(torch.linalg.cond(sum(g.float().double() for g in gs)))
    want = regmean(ws, [g.float().double() for g in gs])
    assert_close_to_dtype(out, want, torch.float32, terms=len(ws) * 4, cond=cond)


def test_weighted_mean() -> None:
    xs = [torch.tensor([1.0, 2.0]), torch.tensor([4.0, -1.0]), torch.tensor([0.0, 0.5])]
    ns = [1, 3, 6]
    expected = torch.tensor([13.0 / 10, 2.0 / 10], dtype=F64)
    torch.testing.assert_close(weighted_mean(xs, ns), expected, rtol=0, atol=1e-15)
    # weight 0 (a client with none of the task's samples) adds nothing, bit for bit
    assert torch.equal(weighted_mean(xs, [1, 0, 2]), weighted_mean([xs[0], xs[2]], [1, 2]))
    assert torch.equal(weighted_mean(xs, [0, 3, 6]), weighted_mean(xs[1:], [3, 6]))
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match=f"finite and >= 0, got {bad}"):
            weighted_mean(xs, [1, bad, 2])
    with pytest.raises(ValueError, match="all have weight 0"):
        weighted_mean(xs, [0, 0, 0])


# ----------------------------------------------------------------------------- streaming


def held_shapes(obj: object) -> list[tuple[int, ...]]:
    """Shapes of every tensor an accumulator holds, through nested objects and lists."""
    if isinstance(obj, Tensor):
        return [tuple(obj.shape)]
    if isinstance(obj, (list, tuple)):
        return [s for item in obj for s in held_shapes(item)]
    if hasattr(obj, "__dict__"):  # every attribute, not only declared fields
        return sorted(s for value in vars(obj).values() for s in held_shapes(value))
    return []


def fold_all(acc: object, args: Sequence[tuple]) -> object:
    for a in args:
        acc.fold(*a)
    return acc


@pytest.mark.parametrize("kind", FULL_RANK_KINDS)
def test_accumulators_match_list_functions_in_constant_memory(kind: str) -> None:
    gen = torch.Generator().manual_seed(13)
    n, d_out, d_in, r = 30, 4, 5, 2
    _, gs = make_inputs(gen, n, d_in, kind)
    ws, bs = randn_list(gen, n, d_out, d_in), randn_list(gen, n, d_out, r)
    as_ = randn_list(gen, n, r, d_in)
    xs, counts = [randn(gen, 3) for _ in range(n)], [float(i + 1) for i in range(n)]
    shared_a = as_[0]
    cases = [
        (lambda: RegMeanAccumulator(d_out, d_in), list(zip(ws, gs)), lambda k: regmean(ws[:k], gs[:k])),
        (
            lambda: LoraBAccumulator(shared_a, d_out),
            list(zip(bs, gs)),
            lambda k: merge_lora_b(bs[:k], shared_a, gs[:k]),
        ),
        (lambda: LoraAAccumulator(r, d_in), list(zip(as_, gs)), lambda k: merge_lora_a(as_[:k], gs[:k])),
        (lambda: WeightedMeanAccumulator((3,)), list(zip(xs, counts)), lambda k: weighted_mean(xs[:k], counts[:k])),
    ]
    for make, args, list_fn in cases:
        small, large = fold_all(make(), args[:3]), fold_all(make(), args)
        assert torch.equal(small.result(), list_fn(3)) and torch.equal(large.result(), list_fn(n))
        assert small.count == 3 and large.count == n
        assert held_shapes(small) == held_shapes(large)
    small = fold_all(GramSum(d_in), [(g,) for g in gs[:3]])
    large = fold_all(GramSum(d_in), [(g,) for g in gs])
    total = gs[0].clone()
    for g in gs[1:]:
        total = total + g
    assert torch.equal(large.value(), total)
    assert held_shapes(small) == held_shapes(large) == [tuple(gs[0].shape)]  # diagonal stays diagonal


def test_task_accumulator_grows_with_tasks_only() -> None:
    gen = torch.Generator().manual_seed(14)
    d_out, d_in, n_clients = 4, 5, 6
    rs = [1, 3, 2, 2, 1]
    acc = TaskMergeAccumulator(d_out, d_in)
    bs, as_, task_grams = [], [], []
    for t, r in enumerate(rs):
        # G^t = sum_i G_i^t is itself streamed, so the task merge never sees clients.
        client_grams = make_inputs(gen, n_clients, d_in, "full")[1]
        g_t = fold_all(GramSum(d_in), [(g,) for g in client_grams]).value()
        bs.append(randn(gen, d_out, r))
        as_.append(randn(gen, r, d_in))
        task_grams.append(g_t)
        acc.fold(bs[-1], as_[-1], g_t)
        seen = rs[: t + 1]
        expected = sorted([(d_out, q) for q in seen] + [(q, d_in) for q in seen] + [(d_in, d_in)])
        assert held_shapes(acc) == expected
    b_cat, a_cat = acc.result()
    ref_b, ref_a = merge_tasks(bs, as_, task_grams)
    assert torch.equal(b_cat, ref_b) and torch.equal(a_cat, ref_a) and acc.count == len(rs)


def test_empty_accumulators_raise() -> None:
    for acc in (
        RegMeanAccumulator(2, 3),
        LoraAAccumulator(1, 3),
        TaskMergeAccumulator(2, 3),
        LoraBAccumulator(torch.ones(1, 3), 2),
        WeightedMeanAccumulator((2,)),
    ):
        with pytest.raises(ValueError, match="nothing folded"):
            acc.result()
    with pytest.raises(ValueError, match="nothing folded"):
        GramSum(3).value()


# ----------------------------------------------------------------------------- decay and errors


def test_decay_gram() -> None:
    gen = torch.Generator().manual_seed(15)
    x = randn(gen, 9, 4)
    g = x.T @ x
    assert torch.equal(decay_gram(g, 1.0), g)
    assert torch.equal(decay_gram(g, 0.0), torch.diagonal(g))
    assert decay_gram(g, 0.0).shape == (4,)
    out = decay_gram(g, 0.3)
    off = ~torch.eye(4, dtype=torch.bool)
    torch.testing.assert_close(out[off], 0.3 * g[off], rtol=0, atol=1e-15)
    torch.testing.assert_close(torch.diagonal(out), torch.diagonal(g), rtol=1e-15, atol=0)
    vec = torch.rand(4, generator=gen, dtype=F64)
    assert torch.equal(decay_gram(vec, 0.5), vec)  # already diagonal
    assert decay_gram(g.float(), 1.0).dtype == F64


@pytest.mark.parametrize("gamma", [-0.1, 1.5, float("nan")])
def test_decay_gram_rejects_bad_gamma(gamma: float) -> None:
    with pytest.raises(ValueError, match="gamma"):
        decay_gram(torch.eye(3), gamma)


def test_decay_gram_rejects_non_square() -> None:
    with pytest.raises(ValueError, match=r"got \(3, 4\)"):
        decay_gram(torch.ones(3, 4), 0.5)


W34, G4 = torch.ones(3, 4), torch.ones(4)


@pytest.mark.parametrize(
    "call, expected, actual",
    [
        (lambda: regmean([W34, torch.ones(3, 5)], [G4, G4]), r"\(3, 4\)", r"\(3, 5\)"),
        (lambda: regmean([W34, W34], [G4, torch.ones(5)]), r"\(4,\) or \(4, 4\)", r"\(5,\)"),
        (lambda: regmean([W34, W34], [G4, torch.ones(4, 5)]), r"\(4,\) or \(4, 4\)", r"\(4, 5\)"),
        (
            lambda: merge_lora_b([torch.ones(3, 2), torch.ones(3, 1)], torch.ones(2, 4), [G4, G4]),
            r"\(3, 2\)",
            r"\(3, 1\)",
        ),
        (lambda: merge_lora_b([torch.ones(3, 2)], torch.ones(2, 4), [torch.ones(3)]), r"\(4,\)", r"\(3,\)"),
        (lambda: merge_lora_b([torch.ones(3, 2)], torch.ones(4), [G4]), r"\(r, d_in\)", r"\(4,\)"),
        (lambda: merge_lora_a([torch.ones(2, 4), torch.ones(2, 3)], [G4, G4]), r"\(2, 4\)", r"\(2, 3\)"),
        (lambda: merge_tasks([torch.ones(3, 2)], [torch.ones(3, 4)], [G4]), r"\(2, 4\)", r"\(3, 4\)"),
        (
            lambda: merge_tasks([torch.ones(3, 2), torch.ones(5, 1)], [torch.ones(2, 4), torch.ones(1, 4)], [G4, G4]),
            r"\(3, \*\)",
            r"\(5, 1\)",
        ),
        (lambda: weighted_mean([torch.ones(2), torch.ones(3)], [1, 1]), r"\(2,\)", r"\(3,\)"),
        (lambda: regmean([torch.ones(3)], [G4]), r"\(\*, \*\)", r"\(3,\)"),
        (lambda: merge_lora_a([torch.ones(2, 3, 4)], [G4]), r"\(\*, \*\)", r"\(2, 3, 4\)"),
        (lambda: merge_tasks([torch.ones(3, 2)], [torch.ones(2)], [G4]), r"\(\*, \*\)", r"\(2,\)"),
    ],
)
def test_shape_errors_name_expected_and_actual(call: Callable[[], object], expected: str, actual: str) -> None:
    with pytest.raises(ValueError, match=f"{expected}.*got {actual}"):
        call()


@pytest.mark.parametrize(
    "call",
    [
        lambda: regmean([], []),
        lambda: regmean([W34], [G4, G4]),
        lambda: merge_lora_b([torch.ones(3, 2)], torch.ones(2, 4), []),
        lambda: merge_lora_a([torch.ones(2, 4)] * 2, [G4]),
        lambda: merge_tasks([torch.ones(3, 2)], [], [G4]),
        lambda: weighted_mean([torch.ones(2)], [1, 2]),
    ],
)
def test_empty_or_unequal_lists_raise(call: Callable[[], object]) -> None:
    with pytest.raises(ValueError):
        call()


def test_singular_full_gram_gives_the_pseudo_inverse_solution():
    """Rank-deficient inputs: the minimum-norm minimiser ``M pinv(S)``, as the reference's pinv."""
    from common.merges.solve import right_solve

    g = torch.Generator().manual_seed(11)
    x = torch.randn(3, 6, generator=g, dtype=torch.float64)  # 3 rows in 6 dims: rank 3
    s = x.T @ x
    m = torch.randn(2, 6, generator=g, dtype=torch.float64)
    torch.testing.assert_close(right_solve(m, s), m @ torch.linalg.pinv(s, hermitian=True), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("case", ["alive", "dead inputs", "singular", "unshifted"])
def test_a_shifted_solve_is_the_solve_of_the_shifted_matrix_bit_for_bit(case: str) -> None:
    """``right_solve(m, s, shift)`` adds ``shift`` to the diagonal inside the solve: the same bits as solving with
    ``s + shift I`` formed first (a ridge head's ``G + lam I``), on every path: all inputs alive (Cholesky), some
    dead (zero columns), singular (the pseudo-inverse), no shift. A Gram need not be exactly symmetric."""
    from common.merges.solve import right_solve

    g = torch.Generator().manual_seed(5)
    x = torch.randn(40, 30, generator=g, dtype=torch.float64)
    s = x.T @ x + 1e-9 * torch.randn(30, 30, generator=g, dtype=torch.float64)  # summed: not exactly symmetric
    shift = {"alive": 3.7, "dead inputs": 1e-300, "singular": 0.0, "unshifted": 0.0}[case]
    if case == "dead inputs":
        s[:, :4] = 0.0
        s[:4, :] = 0.0
    if case == "singular":
        s = x[:10].T @ x[:10]  # rank 10 in 30 dims
    m = torch.randn(7, 30, generator=g, dtype=torch.float64)
    got = right_solve(m, s, shift=shift)
    want = right_solve(m, s + shift * torch.eye(30, dtype=torch.float64))
    assert torch.equal(got, want)
    if case == "dead inputs":
        assert bool((got[:, :4] == 0).all())
    if case == "singular":
        torch.testing.assert_close(got, m @ torch.linalg.pinv(s, hermitian=True), rtol=1e-9, atol=1e-12)


def test_a_ridge_solve_holds_one_work_matrix_beside_its_gram() -> None:
    """A ridge head's solve ``S (G + lam I)^-1`` at ``d = 3,000`` (72 MB a matrix), in a fresh process
    (``bench/ridge_solve.py``): its peak resident memory grows by under two matrices beside the Gram and the inputs
    (the work matrix, factored in place, and allocator slack). The explicit ``G + lam I``, its Jacobi-scaled copy,
    LAPACK's copies of the factor and the identity made it five and more (0.8 GB each at a head block of 10,000)."""
    import re
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    run = [sys.executable, str(root / "bench/ridge_solve.py"), "--dim", "3000", "--lam", "1000"]
    out = subprocess.run(run, capture_output=True, text=True, check=True, timeout=300, cwd=root)
    grown = re.search(r"= ([\d.]+) matrices of \(3000, 3000\)", out.stdout)
    assert grown, out.stdout
    assert float(grown.group(1)) < 2, out.stdout
