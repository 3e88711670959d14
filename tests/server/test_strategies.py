"""Strategy aggregation on small inputs whose right answer is known."""

import pytest
import torch

from common.aggregation.validate import UpdateRejected
from common.merges.grams import decay_gram
from common.merges.regmean import merge_lora_a, merge_lora_b, merge_tasks, regmean, weighted_mean
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import Phase
from common.wire.tensors import EXTRA, FACTOR, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, LORA
from server.strategies import make_strategy

from unit_helpers import LORA_SPEC, unit_config
from updates import plan_update

SPEC = LORA_SPEC


config = unit_config


def fake_update(plan, index, *, seed, factors=None):
    g = torch.Generator().manual_seed(seed)
    step = plan.expect(LoraStep)
    facts = {}
    for name, (d_out, d_in) in SPEC.layers.items():
        shapes = {"B": (d_out, 2), "A": (2, d_in)}
        facts[name] = {f: torch.randn(*shapes[f], generator=g) for f in (factors or step.train_factors)}
    grams = {name: torch.rand(d_in, generator=g, dtype=torch.float64) + 0.1 for name, (_, d_in) in SPEC.layers.items()}
    head_weight, head_bias = torch.randn(6, 4, generator=g), torch.randn(6, generator=g)
    x = torch.randn(20, SPEC.feature_dim, generator=g, dtype=torch.float64)
    # Only what the plan asks for, as a real client sends (everything is drawn, so values do not shift).
    return plan_update(
        plan,
        index,
        10 + 5 * index,
        factors=facts,
        grams=grams if step.gram != GramKind.NONE else {},
        head_weight=head_weight if step.send_head else None,
        head_bias=head_bias if step.send_head else None,
        head_gram=x.T @ x if step.head_gram else None,
    )


def drop(update, prefix):
    """Remove every tensor of ``update`` whose wire name starts with ``prefix``."""
    for name in [n for n in update.tensors if n.startswith(prefix)]:
        del update.tensors[name]


@pytest.mark.parametrize("round_, active", [(0, "B"), (1, "A")])
def test_lorm_round_equals_closed_forms(round_, active):
    strategy = make_strategy(config(), SPEC)
    strategy.begin_task(0)
    plan = strategy.configure(0, round_, Phase.TRAIN)
    assert plan.expect(LoraStep).train_factors == (active,)
    ups = [fake_update(plan, i, seed=i) for i in range(3)]
    fold = strategy.fold(plan)
    agg = fold.aggregator
    for u in ups:
        agg.fold(u)
    shared_before = dict(strategy.shared)
    fold.finish()
    for name in SPEC.layers:
        gs = [u.named(GRAM)[name] for u in ups]
        if active == "B":
            want = merge_lora_b([u.by_layer(FACTOR)[name]["B"] for u in ups], shared_before[name].a, gs)
            assert torch.equal(strategy.shared[name].b, want)
            assert torch.equal(strategy.shared[name].a, shared_before[name].a)
        else:
            want = merge_lora_a([u.by_layer(FACTOR)[name]["A"] for u in ups], gs)
            assert torch.equal(strategy.shared[name].a, want)
    head = regmean([u.get(HEAD_WEIGHT) for u in ups], [decay_gram(u.get(HEAD_GRAM), 0.5) for u in ups])
    assert torch.equal(strategy.head_w, head)
    bias = weighted_mean([u.get(HEAD_BIAS) for u in ups], [u.num_samples for u in ups])
    torch.testing.assert_close(strategy.head_b, bias, rtol=0, atol=1e-15)


@pytest.mark.parametrize(
    "break_it, field",
    [
        (lambda u: setattr(u, "round", 1), "round"),
        (lambda u: setattr(u, "run_id", "other"), "run_id"),
        # 0 is a client on its own data that holds none of the task's classes: the coordinator's bound
        # (server/checks.py sample_bounds) refuses it in a run of Dirichlet shards, the aggregator never
        (lambda u: setattr(u, "num_samples", -1), "num_samples"),
        (lambda u: u.tensors.update({"gram/l1": torch.ones(5, dtype=torch.float64)}), "gram/l1"),
        (lambda u: u.tensors.update({"factor/l2/B": torch.ones(3, 3)}), "factor/l2/B"),
        (lambda u: drop(u, "factor/l1/"), "factor"),
        (lambda u: drop(u, HEAD_GRAM), HEAD_GRAM),
    ],
)
def test_rejected_update_changes_nothing(break_it, field):
    def run(with_bad):
        strategy = make_strategy(config(), SPEC)
        strategy.begin_task(0)
        plan = strategy.configure(0, 0, Phase.TRAIN)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        agg.fold(fake_update(plan, 0, seed=0))
        if with_bad:
            bad = fake_update(plan, 1, seed=1)
            break_it(bad)
            with pytest.raises(UpdateRejected) as err:
                agg.fold(bad)
            assert err.value.field == field
        agg.fold(fake_update(plan, 2, seed=2))
        fold.finish()
        return strategy

    clean, dirty = run(False), run(True)
    for name in SPEC.layers:
        assert torch.equal(clean.shared[name].b, dirty.shared[name].b)
    assert torch.equal(clean.head_w, dirty.head_w)


def fold_step(strategy, plan, seed0, factors=None):
    """Three clients' updates (seeds ``seed0 + i``) folded and aggregated; returns the updates."""
    ups = [fake_update(plan, i, seed=seed0 + i, factors=factors) for i in range(3)]
    fold = strategy.fold(plan)
    agg = fold.aggregator
    for u in ups:
        agg.fold(u)
    fold.finish()
    return ups


def test_lorm_task_merge_after_two_tasks():
    strategy = make_strategy(config(rounds_per_task=1), SPEC)
    finals, task_grams = [], []
    for task in range(2):
        strategy.begin_task(task)
        fold_step(strategy, strategy.configure(task, 0, Phase.TRAIN), 10 * task)
        assert [s for s in strategy.steps(task)][-1] == (Phase.TASK_GRAM, 1)
        plan = strategy.configure(task, 1, Phase.TASK_GRAM)
        assert plan.expect(LoraStep).view_scale == pytest.approx(1 / (task + 1))
        if task == 1:  # the Gram pass adds the previous task's delta, scaled by 1 / (t + 1)
            extra = plan.low_rank(EXTRA)["l1"]
            torch.testing.assert_close(extra.b @ extra.a, (finals[0]["l1"].b @ finals[0]["l1"].a / 2).float())
        ups = fold_step(strategy, plan, 100, factors=())
        finals.append(dict(strategy.shared))
        task_grams.append({n: sum(u.named(GRAM)[n] for u in ups) for n in SPEC.layers})
        if task == 0:  # one task: the model is B^0 A^0 itself
            assert torch.equal(strategy.adapter()["l1"].b, finals[0]["l1"].b)
    for name in SPEC.layers:
        b_cat, a_cat = merge_tasks(
            [f[name].b for f in finals], [f[name].a for f in finals], [g[name] for g in task_grams]
        )
        got = strategy.adapter()[name]
        torch.testing.assert_close(got.b @ got.a, b_cat @ a_cat, rtol=1e-12, atol=1e-12)
        assert got.b.shape == (SPEC.layers[name][0], 4)  # rank T * r


def test_fedavg_lora_is_sample_weighted_mean():
    strategy = make_strategy(config(method="fedavg-lora"), SPEC)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    assert plan.expect(LoraStep).train_factors == ("B", "A")
    ups = [fake_update(plan, i, seed=i) for i in range(3)]
    fold = strategy.fold(plan)
    agg = fold.aggregator
    for u in ups:
        agg.fold(u)
    fold.finish()
    n = torch.tensor([10.0, 15.0, 20.0], dtype=torch.float64)
    want = sum(n[i] * ups[i].by_layer(FACTOR)["l2"]["A"].double() for i in range(3)) / n.sum()
    torch.testing.assert_close(strategy.shared["l2"].a, want)


def test_ablation_b_only_never_trains_a():
    strategy = make_strategy(config(method="lorm-b-only", rounds_per_task=3), SPEC)
    strategy.begin_task(0)
    factors = [strategy.configure(0, j, Phase.TRAIN).expect(LoraStep).train_factors for j in range(3)]
    assert factors == [("B",)] * 3


def test_ablation_average_tasks_is_the_mean_of_task_residuals():
    strategy = make_strategy(config(method="lorm-avg-tasks", rounds_per_task=1), SPEC)
    for task in range(2):
        strategy.begin_task(task)
        fold_step(strategy, strategy.configure(task, 0, Phase.TRAIN), 10 * task)
        fold_step(strategy, strategy.configure(task, 1, Phase.TASK_GRAM), 50, factors=())
    f0, f1 = strategy.task_factors
    got = strategy.adapter()["l1"]
    torch.testing.assert_close(got.b @ got.a, (f0["l1"].b @ f0["l1"].a + f1["l1"].b @ f1["l1"].a) / 2)


def test_sequential_variant_trains_on_the_earlier_residuals_and_sums_them():
    """lorm-seq: task 1 trains and runs its Gram passes on W0 + s B^0 A^0 + s B A; the model is the sum."""
    from proto import codec

    strategy = make_strategy(config(method="lorm-seq", rounds_per_task=1, lora_scale=2.0), SPEC)
    for task in range(2):
        strategy.begin_task(task)
        for phase, round_ in strategy.steps(task):
            plan = strategy.configure(task, round_, phase)
            step = plan.expect(LoraStep)
            assert step.train_extra and step.view_scale == 1.0  # no 1/(t+1): the earlier residuals at full weight
            assert codec.plan_from_proto(codec.plan_to_proto(plan)).expect(LoraStep).train_extra  # and it travels
            if task == 0:
                assert plan.low_rank(EXTRA) == {}
            else:
                f0, extra = strategy.task_factors[0]["l1"], plan.low_rank(EXTRA)["l1"]
                torch.testing.assert_close(extra.b @ extra.a, (2.0 * f0.b @ f0.a).float())
            fold_step(strategy, plan, 10 * task + plan.round, factors=None if plan.phase == Phase.TRAIN else ())
    f0, f1 = strategy.task_factors
    got = strategy.adapter()["l1"]
    torch.testing.assert_close(got.b @ got.a, f0["l1"].b @ f0["l1"].a + f1["l1"].b @ f1["l1"].a, rtol=1e-12, atol=1e-12)
    lorm = make_strategy(config(), SPEC).configure(0, 0, Phase.TRAIN)
    assert not lorm.expect(LoraStep).train_extra  # LoRM trains on W0 + s B A


def test_plans_publish_float32_and_b_rounds_keep_the_published_a():
    """Clients compute in float32: plans carry exactly that (half the bytes of float64)."""
    strategy = make_strategy(config(rounds_per_task=3), SPEC)
    strategy.begin_task(0)
    for round_ in range(3):
        plan = strategy.configure(0, round_, Phase.TRAIN)
        lora = [t for f in plan.low_rank(LORA).values() for t in (f.b, f.a)]
        tensors = [plan.get(HEAD_WEIGHT), plan.get(HEAD_BIAS), *lora]
        assert all(t.dtype == torch.float32 for t in tensors)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        for i in range(3):
            agg.fold(fake_update(plan, i, seed=round_ * 10 + i))
        fold.finish()
        if plan.expect(LoraStep).train_factors == ("B",):  # the merge used the published A, and the state keeps it
            assert torch.equal(strategy.shared["l1"].a, plan.low_rank(LORA)["l1"].a.double())
    extra = strategy.eval_plan(0).low_rank(EXTRA)
    assert all(t.dtype == torch.float32 for f in extra.values() for t in (f.b, f.a))
