"""Closed-form heads on frozen features: federated sums give the centralised head.

The centralised references are computed from the union of the clients' feature rows with
generic torch (masks, means, ``torch.linalg.solve``), not with the strategy's helpers.
"""

import json

import pytest
import torch

from client.features import extract, feature_map, random_projection, view_seed
from client.runtime import build_runtime
from common.aggregation.declared import feature_stats_of
from common.aggregation.features import StatSums
from common.aggregation.validate import UpdateRejected
from common.merges.grams import BlockGramSum, GramRows, GramSum, block_gram_factor, gram_factor
from common.methods import split_invariant
from common.methods.checks import validate
from common.methods.closed_form import ACTIVATIONS
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep
from common.wire.messages import Phase
from common.wire.tensors import HEAD_WEIGHT, STAT
from engine.simulation import run_inprocess
from server.strategies import make_strategy
from server.strategies.closed_form import ncm_head, ridge_head, squared_error

from tolerance import assert_close_to_dtype
from unit_helpers import edit_named, valid_update
from updates import plan_update

TINY = dict(
    num_clients=3,
    num_tasks=2,
    beta=0.5,
    seed=3,
    threads=1,
    backbone="tiny-bert",
    extra={"synthetic_classes": 8, "synthetic_train": 40, "synthetic_test": 10},
)
VARIANTS = {
    "ncm": ("ncm", {}),
    "ridge": ("ridge", {}),
    "ridge-rp": ("ridge", {"rp_dim": 96}),
    "ridge-rp-tanh": ("ridge", {"settings": {"ridge": {"rp_dim": 96, "activation": "tanh"}}}),
    # the embeddings' and the last block's first token, each layer-normalised, side by side, projected
    "ridge-layers": (
        "ridge",
        {"settings": {"ridge": {"layers": [0, -1], "pool": "first", "norm": "layer", "rp_dim": 80}}},
    ),
    "ncm-layers": ("ncm", {"settings": {"ncm": {"layers": [1, 2]}}}),
    # an ensemble of three ridge heads, each on its own 32-wide projection, scores averaged
    "ridge-blocks": ("ridge", {"settings": {"ridge": {"rp_dim": 32, "blocks": 3, "lambda_rule": "members"}}}),
    # the same, lambda by the ensemble's own held-out error (clients send the held-out Gram whole, as a factor)
    "ridge-blocks-average": ("ridge", {"settings": {"ridge": {"rp_dim": 32, "blocks": 3, "lambda_rule": "average"}}}),
}
GRID = (1e-2, 1e-1, 1.0, 10.0, 100.0)


def tiny(strategy: str, settings: dict | None = None, **extra) -> RunConfig:
    extra = {**TINY["extra"], "ridge_lambdas": list(GRID), **extra}
    return RunConfig(**{**TINY, "method": strategy, "extra": extra, "settings": settings or {}})


def federated(config: RunConfig):
    """Run the features steps of every task through the strategy; return it and each task's client rows."""
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    workers = [runtime.worker(i, f"c{i}") for i in range(config.num_clients)]
    rows = []  # per task: (features (n, F'), labels (n,), global indices (n,)), clients in order
    settings = feature_stats_of(config).features  # the feature map the clients apply
    projection = random_projection(config, settings.feature_width(runtime.spec.feature_dim))
    for task in range(config.num_tasks):
        strategy.begin_task(task)
        ((phase, round_),) = strategy.steps(task)
        plan = strategy.configure(task, round_, phase)
        fold = strategy.fold(plan)
        aggregator = fold.aggregator
        for worker in workers:
            aggregator.fold(worker.update(plan))
        fold.finish()
        idx = torch.cat([w.shards[task] for w in workers])
        x = torch.cat(
            [
                feature_map(
                    extract(runtime.model, runtime.train, w.shards[task], runtime.device, settings),
                    projection,
                    settings.activation,
                )
                for w in workers
            ]
        )
        rows.append((x, runtime.train.labels[idx], idx))
    return strategy, rows


def union(rows):
    return (torch.cat(parts) for parts in zip(*rows))


def centralised_ridge(x, y, lam, num_classes):
    one_hot = torch.nn.functional.one_hot(y, num_classes).double()
    return torch.linalg.solve(x.T @ x + lam * torch.eye(x.shape[1], dtype=torch.float64), x.T @ one_hot).T


def blocks_of(strategy) -> int:
    return feature_stats_of(strategy.config).blocks


def worst_condition(gram, lam) -> float:
    """The largest condition number of ``G + lam I`` over the Gram (or its diagonal blocks)."""
    blocks = gram if gram.dim() == 3 else gram[None]
    return max(float(torch.linalg.cond(g + lam * torch.eye(g.shape[0], dtype=torch.float64))) for g in blocks)


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_federated_head_equals_centralised_on_the_union(variant):
    name, extra = VARIANTS[variant]
    strategy, rows = federated(tiny(name, **extra))
    x, y, idx = union(rows)  # every sample of both tasks, once
    c = strategy.spec.num_classes
    assert sorted(idx.tolist()) == list(range(c * 40))
    if name == "ncm":
        means = torch.stack([x[y == k].mean(0) for k in range(c)])
        want = means / means.norm(dim=1, keepdim=True)
        torch.testing.assert_close(strategy.head_w, want, rtol=1e-12, atol=1e-12)
        return
    # lambda: least squared error on the held-out rows (global index % 5 == 0) of the head fit on the others;
    # with ridge.blocks = K, K heads on the K column blocks of x (their own projections), their errors summed,
    # or (lambda_rule average) the error of their averaged scores
    held, k = idx % 5 == 0, blocks_of(strategy)
    target = torch.nn.functional.one_hot(y[held], c).double()
    errors = []
    for lam in GRID:
        members = [(part, centralised_ridge(part[~held], y[~held], lam, c)) for part in x.chunk(k, 1)]
        if variant.endswith("average"):
            average = sum(part[held] @ w.T for part, w in members) / k
            errors.append(float(((average - target) ** 2).sum()))
        else:
            errors.append(sum(float(((part[held] @ w.T - target) ** 2).sum()) for part, w in members))
    lam = GRID[min(range(len(GRID)), key=errors.__getitem__)]
    assert strategy.lam == lam
    torch.testing.assert_close(torch.tensor(strategy.errors), torch.tensor(errors), rtol=1e-9, atol=1e-9)
    # the ensemble's head: the members' heads side by side over K, so its scores are their scores' average
    want = torch.cat([centralised_ridge(part, y, lam, c) for part in x.chunk(k, 1)], 1) / k
    # the two solves differ by float64 summation order, amplified by the condition number of G + lam I
    cond = worst_condition(torch.stack([part.T @ part for part in x.chunk(k, 1)]), lam)
    assert_close_to_dtype(strategy.head_w, want, torch.float64, terms=len(x), cond=cond)


def test_dropout_views_change_with_the_split_so_they_are_not_split_invariant():
    """``ridge.views``: each client draws its samples' views from its own shard, so another split of the same
    samples draws others and fits another head: lorm-bench must run such a head at every beta."""
    configs = [tiny("ridge", {"ridge": {"rp_dim": 48, "views": 2}}).replace(beta=beta) for beta in (1.0, 0.2)]
    assert not any(split_invariant(c) for c in configs)
    runs = [run_inprocess(c) for c in configs]
    assert not torch.equal(runs[0].head_weight, runs[1].head_weight)


@pytest.mark.parametrize(
    "change",
    [
        {"method": "lorm-ridge"},  # LoRM trains on each client's own shard first
        {"settings": {"robust": {"enabled": True}}},  # screens each client's own update
        {"settings": {"secagg": {"enabled": True}}},  # rounds each client's terms to fixed point
        {"settings": {"dp": {"epsilon": 1.0}}},  # clips and noises
    ],
)
def test_what_acts_on_a_clients_own_part_is_not_split_invariant(change):
    base = json.loads(tiny("ridge").to_json())
    assert split_invariant(RunConfig.from_dict(base))
    assert not split_invariant(RunConfig.from_dict({**base, **change}))


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_identical_across_betas(variant):
    """Different Dirichlet splits, one result: equal accuracy matrices, heads equal to float64 summation order
    (amplified, for ridge, by the condition number of its regularised Gram)."""
    name, extra = VARIANTS[variant]
    configs = [tiny(name, **extra).replace(beta=beta) for beta in (1.0, 0.2)]
    assert all(split_invariant(c) for c in configs)  # what lets lorm-bench run one beta for all (lab/twins.py)
    runs = [run_inprocess(c) for c in configs]
    made = [run.strategy for run in runs]
    assert runs[0].matrix.correct == runs[1].matrix.correct and runs[0].matrix.total == runs[1].matrix.total
    cond = 1.0
    if name == "ridge":
        cond = worst_condition(made[0].totals.value()["gram"], made[0].lam)
    terms = TINY["extra"]["synthetic_train"] * made[0].spec.num_classes  # the training rows summed
    assert_close_to_dtype(runs[0].head_weight, runs[1].head_weight, torch.float64, terms=terms, cond=cond)
    assert runs[0].adapter == {} and [h["phase"] for h in runs[0].history] == ["features", "evaluate"] * 2


def test_lambda_uses_no_test_data():
    base = tiny("ridge", rp_dim=96)
    runs = [run_inprocess(base), run_inprocess(base.replace(extra={**base.extra, "synthetic_test": 3}))]
    made = [run.strategy for run in runs]
    assert runs[0].matrix.total != runs[1].matrix.total  # the test split did change
    assert made[0].lam == made[1].lam and made[0].errors == made[1].errors
    assert torch.equal(runs[0].head_weight, runs[1].head_weight)


def test_linear_ncm_head_is_cosine_nearest_class_mean():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(200, 7, generator=gen, dtype=torch.float64) * torch.rand(200, 1, generator=gen, dtype=torch.float64)
    y = torch.arange(200) % 5
    sums = torch.stack([x[y == k].sum(0) for k in range(5)])
    means = sums / torch.bincount(y).double()[:, None]
    cosine = torch.nn.functional.cosine_similarity(x[:, None, :], means[None], dim=2)  # (n, classes)
    head = ncm_head(sums, torch.bincount(y).double())
    assert torch.equal((x @ head.T).argmax(1), cosine.argmax(1))


def test_squared_error_from_sums_equals_rowwise():
    gen = torch.Generator().manual_seed(1)
    x = torch.randn(50, 6, generator=gen, dtype=torch.float64)
    y = torch.randint(0, 4, (50,), generator=gen)
    one_hot = torch.nn.functional.one_hot(y, 4).double()
    head = ridge_head(x.T @ x, one_hot.T @ x, 0.5)
    want = float(((x @ head.T - one_hot) ** 2).sum())
    assert squared_error(head, x.T @ x, one_hot.T @ x, one_hot.sum(0)) == pytest.approx(want, rel=1e-12)


@pytest.mark.parametrize("n, d", [(0, 7), (1, 7), (3, 7), (7, 7), (20, 7), (600, 50)])
def test_gram_factor_is_the_gram_in_min_n_d_rows(n, d):
    """``R^T R = X^T X`` to rounding, with ``min(n, d)`` rows: fewer numbers than the Gram when n < d."""
    x = torch.randn(n, d, generator=torch.Generator().manual_seed(n * 100 + d), dtype=torch.float64) * 3
    r = gram_factor(x)
    assert r.shape == (min(n, d), d) and r.dtype == torch.float64
    scale = max(float((x * x).sum()), 1.0)
    assert float((r.T @ r - x.T @ x).abs().max()) <= 1e-13 * scale
    total = GramSum(d)  # folding factors = folding the Grams themselves
    total.fold_factor(r)
    total.fold_factor(gram_factor(x[: n // 2]))
    assert torch.allclose(total.value(), x.T @ x + x[: n // 2].T @ x[: n // 2], rtol=0, atol=1e-12 * scale)


@pytest.mark.parametrize("n", [2, 7, 30])
def test_block_factors_carry_the_grams_diagonal_blocks_only(n):
    """``ridge.blocks``: K factors of ``min(n, d)`` rows, one per column block of ``X: (n, K d)``; folded, the
    K diagonal blocks ``X_k^T X_k`` and nothing of the off-diagonal ones."""
    k, d = 3, 6
    x = torch.randn(n, k * d, generator=torch.Generator().manual_seed(n), dtype=torch.float64)
    r = block_gram_factor(x, k)
    assert r.shape == (k, min(n, d), d)
    total = BlockGramSum(k, d)
    total.fold_factor(r)
    total.fold_factor(block_gram_factor(x[:1], k))
    want = torch.stack(
        [x[:, b].T @ x[:, b] + x[:1, b].T @ x[:1, b] for b in (slice(i * d, (i + 1) * d) for i in range(k))]
    )
    assert_close_to_dtype(total.value(), want, torch.float64, terms=n + 1, cond=1.0)
    with pytest.raises(ValueError, match="do not split into 4 blocks"):
        block_gram_factor(x, 4)
    with pytest.raises(ValueError, match=r"expected shape \(3, \*, 6\)"):
        total.fold_factor(gram_factor(x))  # the whole Gram's factor is not the blocks'


@pytest.mark.parametrize("shape", [(6, 6), (2, 3, 3)], ids=["gram", "blocks"])
def test_absorbing_a_steps_sums_equals_folding_them_and_empties_the_step(shape):
    """The totals take a step's sums as ``fold`` would, to the bit, the first time by taking its Gram over."""
    g = torch.Generator().manual_seed(5)
    shapes = {"class_sum": (4, 6), "gram": shape}

    def step():
        sums = StatSums(shapes)
        x = torch.randn(5, 6, generator=g, dtype=torch.float64)
        factor = gram_factor(x) if len(shape) == 2 else block_gram_factor(x, 2)
        sums.fold({"class_sum": torch.randn(4, 6, generator=g, dtype=torch.float64), "gram_factor": factor})
        return sums

    steps = [step(), step()]
    folded, absorbed = StatSums(shapes), StatSums(shapes)
    for each in steps:
        folded.fold(each.value())
    taken = steps[0].grams["gram"].value()
    for each in steps:
        absorbed.absorb(each)
    assert absorbed.grams["gram"].total is taken or len(shape) == 2  # blocks: summed in place into the first step's
    assert all(torch.equal(absorbed.value()[k], v) for k, v in folded.value().items())
    assert absorbed.count == folded.count == 2 and all(each.grams["gram"].total is None for each in steps)


def stats_update(plan, dim, index, seed, blocks=1, held_blocks=None):
    """A features step's update of 12 random rows (every 4th held out); the Gram factors of ``blocks`` blocks,
    the held-out one's of ``held_blocks`` (default: ``blocks``)."""
    gen = torch.Generator().manual_seed(seed)
    lo, hi = plan.class_range
    y = torch.randint(lo, hi, (12,), generator=gen)
    x = torch.randn(12, dim, generator=gen, dtype=torch.float64)
    one_hot = torch.nn.functional.one_hot(y - lo, hi - lo).double()  # the task's classes only

    def factor(rows, k=blocks):
        return gram_factor(rows) if k == 1 else block_gram_factor(rows, k)

    stats = {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0), "gram_factor": factor(x)}
    held = torch.arange(12) % 4 == 0
    stats |= {
        "holdout_class_sum": one_hot[held].T @ x[held],
        "holdout_class_count": one_hot[held].sum(0),
        "holdout_gram_factor": factor(x[held], blocks if held_blocks is None else held_blocks),
    }
    return plan_update(
        plan,
        index,
        12,
        stats=stats,
    )


def fold_task(strategy, task, seed):
    strategy.begin_task(task)
    plan = strategy.configure(task, 0, Phase.FEATURES)
    fold = strategy.fold(plan)
    agg = fold.aggregator
    for i in range(2):
        k = blocks_of(strategy)
        agg.fold(stats_update(plan, strategy.dim, i, seed + i, k, 1 if strategy.average_rule else k))
    fold.finish()


@pytest.mark.parametrize(
    "settings",
    [
        {},
        {"ridge": {"rp_dim": 4, "blocks": 2, "lambda_rule": "members"}},
        {"ridge": {"rp_dim": 4, "blocks": 2, "lambda_rule": "average"}},
    ],
    ids=["one", "blocks", "blocks-average"],
)
def test_restart_from_state_gives_the_same_heads(settings):
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=5, num_classes=6)
    config = RunConfig(method="ridge", num_tasks=2, extra={"ridge_lambdas": list(GRID)}, settings=settings)
    straight = make_strategy(config, spec)
    fold_task(straight, 0, 10)
    restarted = make_strategy(config, spec)
    restarted.load_state_tensors(straight.state_tensors())
    assert restarted.lam == straight.lam
    fold_task(straight, 1, 20)
    fold_task(restarted, 1, 20)
    assert torch.equal(restarted.head_w, straight.head_w) and restarted.lam == straight.lam


def _into_the_weakest_direction(stats: dict[str, torch.Tensor]) -> None:
    """Every class sum turned, at its length, into the direction the client's Gram holds least: ``sum_c |S_c|^2 /
    n_c`` stays within the Gram's trace, but not ``sum_c S_c S_c^T / n_c`` within the Gram, so no features give
    it; a head fit to it puts its weight where the client's samples have none."""
    factor = stats["gram_factor"]
    weakest = torch.linalg.eigh(factor.T @ factor).eigenvectors[:, 0]
    stats["class_sum"] = stats["class_sum"].norm(dim=1, keepdim=True) * weakest


@pytest.mark.parametrize(
    "break_it, field",
    [
        (lambda s: s.pop("gram_factor"), "stat"),
        (lambda s: s.update(gram_factor=torch.eye(4, dtype=torch.float64)), "stat/gram_factor"),  # width 4, not 5
        (lambda s: s.update(gram_factor=torch.ones(6, 5, dtype=torch.float64)), "stat/gram_factor"),  # rows > F'
        (
            lambda s: s.update(holdout_gram_factor=torch.ones(4, 5, dtype=torch.float64)),  # rows > its 3 samples
            "stat/holdout_gram_factor",
        ),
        (lambda s: s.update(gram_factor=s["gram_factor"] * 0.1), "stat/class_sum"),  # a Gram too small for the sums
        (_into_the_weakest_direction, "stat/class_sum"),  # within the Gram's trace, beyond the Gram
        (  # the held-out samples' Gram beyond the client's whole Gram: the lambda fit's Gram made indefinite
            lambda s: s.update(holdout_gram_factor=s["holdout_gram_factor"] * 2),
            "stat/holdout_gram_factor",
        ),
        (lambda s: s.update(class_count=torch.zeros(6, dtype=torch.float64)), "stat/class_count"),  # every class's
        (lambda s: s["class_count"].__setitem__(0, s["class_count"][0] + 1), "stat/class_count"),  # sum != samples
        (lambda s: s["class_sum"].__setitem__((0, 0), float("nan")), "stat/class_sum"),
    ],
)
def test_rejected_statistics(break_it, field):
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=5, num_classes=6)
    strategy = make_strategy(RunConfig(method="ridge", num_tasks=2), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    update = stats_update(plan, 5, 0, 0)
    edit_named(update, STAT, break_it)
    with pytest.raises(UpdateRejected) as err:
        strategy.aggregator(plan).fold(update)
    assert err.value.field == field


@pytest.mark.parametrize(
    "break_it",
    [
        lambda s: s.update(gram_factor=gram_factor(torch.ones(12, 8, dtype=torch.float64))),  # the whole Gram's
        lambda s: s.update(holdout_gram_factor=torch.ones(2, 4, 4, dtype=torch.float64)),  # 4 rows, 3 samples
        lambda s: s.update(gram_factor=s["gram_factor"][:, :, :2]),  # blocks of width 2, not 4
    ],
    ids=["whole-gram", "rows-over-samples", "narrow-blocks"],
)
def test_a_blocks_step_takes_only_the_diagonal_blocks_factors(break_it):
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=5, num_classes=6)
    ridge = {"rp_dim": 4, "blocks": 2, "lambda_rule": "members"}
    strategy = make_strategy(RunConfig(method="ridge", num_tasks=2, settings={"ridge": ridge}), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    strategy.aggregator(plan).fold(stats_update(plan, 8, 0, 0, blocks=2))  # as sent: accepted
    update = stats_update(plan, 8, 1, 0, blocks=2)
    edit_named(update, STAT, break_it)
    with pytest.raises(UpdateRejected, match="gram_factor"):
        strategy.aggregator(plan).fold(update)


@pytest.mark.parametrize(
    "break_it",
    [
        lambda s: s.update(holdout_gram_factor=block_gram_factor(s["holdout_gram_factor"], 2)),  # the blocks' only
        lambda s: s.update(holdout_gram_factor=torch.ones(4, 8, dtype=torch.float64)),  # 4 rows, 3 samples
    ],
    ids=["blocks-only", "rows-over-samples"],
)
def test_the_average_rule_takes_the_held_out_gram_whole(break_it):
    """``ridge.lambda_rule = 'average'``: the held-out samples' factor spans all ``K d`` columns, the training
    Gram's factors stay the diagonal blocks'; the coordinator keeps the held-out rows stacked."""
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=5, num_classes=6)
    ridge = {"rp_dim": 4, "blocks": 2, "lambda_rule": "average"}
    strategy = make_strategy(RunConfig(method="ridge", num_tasks=2, settings={"ridge": ridge}), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    agg = strategy.aggregator(plan)
    sent = [stats_update(plan, 8, i, i, blocks=2, held_blocks=1) for i in range(2)]
    for update in sent:
        agg.fold(update)  # as sent: accepted
    held = agg.sums.value()["holdout_gram_factor"]  # the two clients' 3 held-out rows each, stacked
    want = sum(u.named(STAT)["holdout_gram_factor"].T @ u.named(STAT)["holdout_gram_factor"] for u in sent)
    assert held.shape == (6, 8)
    assert_close_to_dtype(held.T @ held, want, torch.float64, terms=6)
    update = stats_update(plan, 8, 2, 2, blocks=2, held_blocks=1)
    edit_named(update, STAT, break_it)
    with pytest.raises(UpdateRejected, match="holdout_gram_factor"):
        strategy.aggregator(plan).fold(update)


@pytest.mark.parametrize("n", [3, 8, 11])
def test_gram_rows_stack_factors_and_stay_within_the_width(n):
    """``GramRows``: the folded factors' Gram, whole, in at most ``d_in`` rows however many are folded."""
    gen = torch.Generator().manual_seed(n)
    parts = [torch.randn(n, 5, generator=gen, dtype=torch.float64) for _ in range(4)]
    rows = GramRows(5)
    for part in parts:
        rows.fold_factor(gram_factor(part))
    x = torch.cat(parts)
    assert rows.value().shape == (min(4 * n, 5), 5) and rows.count == 4
    assert_close_to_dtype(rows.value().T @ rows.value(), x.T @ x, torch.float64, terms=len(x))
    with pytest.raises(ValueError, match="fold_factor"):
        rows.fold(x.T @ x)


def test_features_step_travels_over_the_wire():
    """The plans (features mode, a head of width F' at evaluation) and the statistics survive the codec."""
    from common.wire.messages import ModelSpec
    from proto import codec

    spec = ModelSpec(layers={}, feature_dim=5, num_classes=6)
    strategy = make_strategy(validate(RunConfig(method="ridge", num_tasks=2, extra={"rp_dim": 9})), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    got = codec.plan_from_proto(codec.plan_to_proto(plan))
    assert (got.mode, got.expect(FeaturesStep).head_gram, got.get(HEAD_WEIGHT)) == ("features", True, None)
    update = stats_update(plan, 9, 0, 0)
    _, back = codec.update_from_proto(codec.update_to_proto(update, "k"))
    sent, stats = update.named(STAT), back.named(STAT)
    assert set(stats) == set(sent)
    assert all(torch.equal(stats[n], t) for n, t in sent.items())
    # 12 samples of the 3 classes of task 0: the task's rows of the sums, the Gram as its (9, 9) factor
    assert stats["class_sum"].shape == (3, 9) and stats["gram_factor"].shape == (9, 9)
    assert stats["holdout_gram_factor"].shape == (3, 9)  # 3 held-out samples: 3 rows, not 9
    fold_task(strategy, 0, 1)
    evaluation = codec.plan_from_proto(codec.plan_to_proto(strategy.eval_plan(0)))
    assert evaluation.mode == "features" and tuple(evaluation.get(HEAD_WEIGHT).shape) == (6, 9)


def test_the_chosen_lambda_and_every_candidates_error_are_in_the_history_and_the_log():
    lines: list[str] = []
    result = run_inprocess(tiny("ridge"), log=lines.append)
    steps = [h for h in result.history if h["phase"] == "features"]
    assert len(steps) == 2
    for step in steps:
        errors = step["ridge_heldout_error"]
        assert sorted(float(k) for k in errors) == sorted(GRID)
        assert step["ridge_lambda"] == min(GRID, key=lambda lam: errors[repr(lam)])
    assert sum("features" in line and f"ridge_lambda {steps[-1]['ridge_lambda']}" in line for line in lines) >= 1
    summary = result.summary()  # what metrics.json holds
    assert [h.get("ridge_lambda") for h in summary["history"] if h["phase"] == "features"] == [
        s["ridge_lambda"] for s in steps
    ]


@pytest.mark.parametrize("activation", ACTIVATIONS)  # every name the setting accepts has its function
def test_the_projections_activation(activation):
    """``f(X P^T)`` with ``f`` the setting: each activation is its function, elementwise, of the projection."""
    gen = torch.Generator().manual_seed(4)
    x, p = torch.randn(7, 5, generator=gen), torch.randn(9, 5, generator=gen, dtype=torch.float64)
    z = x.double() @ p.T
    want = {"relu": z.clamp_min(0), "gelu": 0.5 * z * (1 + torch.erf(z / 2**0.5)), "tanh": torch.tanh(z), "none": z}
    got = feature_map(x, p, activation)
    assert got.dtype == torch.float64 and got.shape == (7, 9)
    assert_close_to_dtype(got, want[activation], torch.float64, terms=5)  # the same product; f's rounding
    assert torch.equal(feature_map(x, None, activation), x.double())  # no projection, no activation


def weighted_rows(clean, views, y, num_classes):
    """Each sample's clean row and its views at weight 1 / (1 + V): the Gram and class sums ``ridge.views`` means."""
    rows = torch.stack([clean, *views])  # (1 + V, n, F')
    gram = torch.einsum("vnf,vng->fg", rows, rows) / rows.shape[0]
    one_hot = torch.nn.functional.one_hot(y, num_classes).double()
    return gram, one_hot.T @ rows.mean(0)


@pytest.mark.parametrize("ridge", [{"rp_dim": 48}, {"rp_dim": 16, "blocks": 3, "lambda_rule": "average"}])
def test_dropout_views_head_is_the_weighted_fit_and_lambda_scores_clean_held_out_rows(ridge):
    """``ridge.views = 2``: the federated head is the ridge of every sample's clean features and two dropout views
    at weight 1/3 each, and lambda the one whose head, fitted without any row of the held-out samples, errs least
    on their clean rows, recomputed here from the clients' own views."""
    config = tiny("ridge", {"ridge": {**ridge, "views": 2}})
    strategy, rows = federated(config)
    runtime = build_runtime(config)
    settings = feature_stats_of(config).features
    projection = random_projection(config, settings.feature_width(runtime.spec.feature_dim))
    workers = [runtime.worker(i, f"c{i}") for i in range(config.num_clients)]
    views = [
        torch.cat(
            [
                feature_map(
                    extract(runtime.model, runtime.train, shard, runtime.device, settings, view_seed(config, v, shard)),
                    projection,
                )
                for task in range(config.num_tasks)
                for shard in [w.shards[task] for w in workers]
            ]
        )
        for v in range(2)
    ]
    x, y, idx = union(rows)
    assert not torch.allclose(views[0], x) and not torch.allclose(views[0], views[1])  # the dropout was on
    c, k, held = strategy.spec.num_classes, blocks_of(strategy), idx % 5 == 0
    width = x.shape[1] // k
    members = [slice(i * width, (i + 1) * width) for i in range(k)]  # each member's columns
    target = torch.nn.functional.one_hot(y[held], c).double()
    errors = []
    for lam in GRID:
        scores = 0
        for cols in members:
            gram, sums_ = weighted_rows(x[~held][:, cols], [v[~held][:, cols] for v in views], y[~held], c)
            head = torch.linalg.solve(gram + lam * torch.eye(gram.shape[0], dtype=torch.float64), sums_.T).T
            scores = scores + x[held][:, cols] @ head.T / k
        errors.append(float(((scores - target) ** 2).sum()))
    assert strategy.errors == pytest.approx(errors, rel=1e-9, abs=1e-9)
    lam = GRID[min(range(len(GRID)), key=errors.__getitem__)]
    assert strategy.lam == lam
    want, grams = [], []
    for cols in members:
        gram, sums_ = weighted_rows(x[:, cols], [v[:, cols] for v in views], y, c)
        grams.append(gram)
        want.append(torch.linalg.solve(gram + lam * torch.eye(width, dtype=torch.float64), sums_.T).T / k)
    cond = worst_condition(torch.stack(grams), lam)
    assert_close_to_dtype(strategy.head_w, torch.cat(want, 1), torch.float64, terms=3 * len(x), cond=cond)


@pytest.mark.parametrize(
    "break_it, field",
    [
        (None, None),  # honest: 36 rows of 12 samples' clean features and two views each, 9 of the 3 held out
        (lambda s: s.update(gram_factor=torch.ones(37, 48, dtype=torch.float64)), "stat/gram_factor"),  # > 3 x 12
        (lambda s: s.update(heldfit_gram_factor=torch.ones(10, 48, dtype=torch.float64)), "stat/heldfit_gram_factor"),
        (lambda s: s.update(holdout_gram_factor=s["heldfit_gram_factor"]), "stat/holdout_gram_factor"),  # clean: 3
        (
            lambda s: s["heldfit_class_count"].__setitem__(0, s["heldfit_class_count"][0] + 1),
            "stat/heldfit_class_count",
        ),
        (lambda s: s.update(heldfit_class_sum=s["heldfit_class_sum"] * 10), "stat/heldfit_class_sum"),  # > its Gram
        (lambda s: s.pop("heldfit_gram_factor"), "stat"),
        # The share's Gram beyond the whole one: the fit that chooses lambda would use an indefinite Gram.
        (lambda s: s.update(heldfit_gram_factor=s["heldfit_gram_factor"] * 2), "stat/heldfit_gram_factor"),
        # The clean held-out Gram, which scores lambda, beyond 3 times the share it is part of: a score moved with
        # no sample behind it.
        (lambda s: s.update(holdout_gram_factor=s["holdout_gram_factor"] * 3), "stat/holdout_gram_factor"),
    ],
    ids=[
        "honest",
        "rows-over-views",
        "share-rows",
        "held-out-rows",
        "share-counts",
        "share-sums",
        "no-share",
        "share-beyond-gram",
        "clean-beyond-share",
    ],
)
def test_a_views_step_bounds_rows_by_the_views_and_the_share_by_the_held_out_samples(break_it, field):
    """``ridge.views = 2``: a sample's clean features and two views make three factor rows; the held-out samples'
    clean statistics one row each; their share of the sums counts exactly them and fits its own Gram."""
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=48, num_classes=6)
    strategy = make_strategy(RunConfig(method="ridge", num_tasks=2, settings={"ridge": {"views": 2}}), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    update = valid_update(plan, strategy.aggregator(plan).expected(), 0, seed=0)
    if break_it is None:
        fold = strategy.fold(plan)
        agg = fold.aggregator
        agg.fold(update)
        fold.finish()
        assert strategy.lam in strategy.grid and len(strategy.errors) == len(strategy.grid)
        return
    edit_named(update, STAT, break_it)
    with pytest.raises(UpdateRejected) as err:
        strategy.aggregator(plan).fold(update)
    assert err.value.field == field


def test_without_views_a_factor_of_more_rows_than_samples_is_refused():
    from common.wire.messages import ModelSpec

    spec = ModelSpec(layers={}, feature_dim=48, num_classes=6)
    strategy = make_strategy(RunConfig(method="ridge", num_tasks=2), spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    views = make_strategy(RunConfig(method="ridge", num_tasks=2, settings={"ridge": {"views": 2}}), spec)
    views.begin_task(0)
    update = valid_update(plan, views.aggregator(views.configure(0, 0, Phase.FEATURES)).expected(), 0, seed=0)
    edit_named(update, STAT, lambda s: [s.pop(n) for n in list(s) if n.startswith("heldfit_")])
    with pytest.raises(UpdateRejected) as err:
        strategy.aggregator(plan).fold(update)
    assert err.value.field == "stat/gram_factor"


def test_negative_views_are_refused():
    from common.methods.closed_form import RidgeSettings

    with pytest.raises(ValueError, match="ridge.views"):
        RidgeSettings(views=-1)
