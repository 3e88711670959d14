"""PILoRA: the prototype re-weighting and the orthogonality term by hand, and the incremental
LoRA the coordinator stacks task by task."""

from __future__ import annotations

import dataclasses
import math

import torch
from test_baselines import SPEC as BASELINES_SPEC

from client.methods.pilora import orthogonality, scaled_distance
from common.aggregation.declared import declared_tensors
from common.methods.fedproto import PROTO
from common.methods.pilora import PiLoraSettings
from common.run.config import RunConfig
from common.wire.instructions import LoraStep
from common.wire.messages import Phase
from common.wire.tensors import EXTRA, STAT, tensor_name
from server.strategies import make_strategy
from server.strategies.pilora import reweight

from updates import plan_update

F64 = torch.float64
EPS = torch.finfo(F64).eps
SPEC = dataclasses.replace(BASELINES_SPEC, num_classes=6)  # 3 classes per task, the third held by no client


def test_reweight_by_hand_favours_the_prototype_nearest_the_class_means():
    prototypes = torch.tensor([[0.0, 0.0], [3.0, 4.0], [6.0, 8.0]], dtype=F64)
    means = torch.tensor([[0.0, 0.0]], dtype=F64)  # one client holds the class, its mean at the origin
    # distances 0, 5, 10 -> reciprocals 1e10, 1/5, 1/10 -> min-max normalised 1, ~1e-11, 0
    w = torch.softmax(torch.tensor([1.0, (0.2 - 0.1) / (1e10 - 0.1), 0.0], dtype=F64) * 2.0, dim=0)
    got = reweight(prototypes, means, soft_temp=2.0)
    assert torch.allclose(got, (w[:, None] * prototypes).sum(0), rtol=1e-9)
    assert got.norm() < prototypes[1:].norm(dim=1).mean()  # pulled towards the nearest
    same = reweight(torch.ones(3, 2, dtype=F64), means, soft_temp=2.0)  # equal distances: a plain mean
    assert torch.allclose(same, torch.ones(2, dtype=F64))


def test_the_default_factor_is_pilora_s_and_lets_the_holders_prototypes_dominate():
    """PILoRA's code weighs clients by softmax(minmax(1/d) / 0.2); the LoRM paper's code multiplies by 0.2,
    which weighs all ten clients nearly alike. Two clients hold the class (their prototypes on its mean),
    eight never saw it (prototypes 10 to 17 away)."""
    assert PiLoraSettings().soft_temp == 1 / 0.2
    prototypes = torch.zeros(10, 2, dtype=F64)
    prototypes[2:, 0] = 10.0 + torch.arange(8, dtype=F64)
    means = torch.zeros(2, 2, dtype=F64)
    holders = torch.softmax(torch.tensor([1.0, 1.0] + [0.0] * 8, dtype=F64) * 5.0, dim=0)[:2].sum()
    assert holders > 0.97  # each non-holder's normalised reciprocal is below 1e-10: 0 within float64
    merged = reweight(prototypes, means, PiLoraSettings().soft_temp)
    assert torch.allclose(merged, (1 - holders) * prototypes[2:].mean(0), rtol=1e-6)
    assert merged.norm() < 0.5  # within 0.5 of the class mean
    assert reweight(prototypes, means, 0.2).norm() > 10.0  # the paper's code: mostly the non-holders' mean


def test_orthogonality_by_hand_and_its_gradient_reduces_the_overlap():
    a_old = {"l": torch.tensor([[1.0, 0.0, 0.0]])}
    a_new = {"l": torch.tensor([[2.0, -1.0, 0.0], [0.5, 0.0, 3.0]], requires_grad=True), "other": torch.ones(1, 3)}
    term = orthogonality(a_new, a_old)  # |A_t A_old^T| entrywise: |2| + |0.5|; "other" has no old module
    assert term is not None and term.item() == 2.5
    term.backward()
    assert torch.equal(a_new["l"].grad, torch.tensor([[1.0, 0.0, 0.0], [1.0, 0.0, 0.0]]))
    assert orthogonality(a_new, {}) is None


def test_scaled_distance_is_the_euclidean_distance_over_sqrt_f():
    gen = torch.Generator().manual_seed(0)
    f, p = torch.randn(5, 4, generator=gen, dtype=F64), torch.randn(3, 4, generator=gen, dtype=F64)
    assert torch.allclose(scaled_distance(f, p), torch.cdist(f, p) / 2.0, atol=1e3 * EPS)


def test_each_task_adds_a_module_on_top_of_the_frozen_earlier_ones():
    config = RunConfig(num_clients=2, num_tasks=2, rounds_per_task=1, seed=2, method="pilora", rank=2)
    strategy = make_strategy(config, SPEC)
    gen = torch.Generator().manual_seed(3)
    modules = []
    for task, (lo, hi) in enumerate(strategy.tasks):
        strategy.begin_task(task)
        plan = strategy.configure(task, 0, Phase.TRAIN)
        step = plan.expect(LoraStep)
        assert step.train_extra and step.train_factors == ("B", "A") and not step.send_head
        assert plan.named(PROTO)["count"].sum() == hi  # the task's classes have prototypes from its start
        assert set(plan.low_rank(EXTRA)) == (set(SPEC.layers) if task else set())
        declared = declared_tensors(plan, SPEC, config)
        assert declared[tensor_name(STAT, "prototype")] == (hi - lo, SPEC.feature_dim)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        for i, n in enumerate((4, 6)):
            factors = {
                name: {"B": torch.randn(d_out, 2, generator=gen), "A": torch.randn(2, d_in, generator=gen)}
                for name, (d_out, d_in) in SPEC.layers.items()
            }
            counts = torch.tensor([n - 1.0, 1.0] + [0.0] * (hi - lo - 2), dtype=F64)
            stats = {
                "class_sum": torch.randn(hi - lo, SPEC.feature_dim, generator=gen, dtype=F64) * (counts[:, None] > 0),
                "class_count": counts,
                "prototype": torch.randn(hi - lo, SPEC.feature_dim, generator=gen, dtype=F64),
            }
            agg.fold(plan_update(plan, i, n, factors=factors, stats=stats))
        before = strategy.proto.clone()
        fold.finish()
        assert not torch.equal(strategy.proto[lo : lo + 2], before[lo : lo + 2])  # held classes re-weighted
        assert hi - lo == 3 and torch.equal(strategy.proto[lo + 2 : hi], before[lo + 2 : hi])  # no holder: kept
        assert torch.equal(strategy.proto[:lo], before[:lo])  # old prototypes: frozen
        modules.append({name: f.b @ f.a for name, f in strategy.current.items()})
    adapter = strategy.adapter()
    for name in SPEC.layers:  # W0 + sum_t B_t A_t
        assert adapter[name].b.shape[1] == 4
        assert torch.allclose(adapter[name].b @ adapter[name].a, modules[0][name] + modules[1][name], atol=1e-12)
    again = make_strategy(config, SPEC)
    again.load_state_tensors(strategy.state_tensors())
    assert again.seen == strategy.seen and torch.equal(again.proto, strategy.proto)
    assert all(torch.equal(again.done[n].a, strategy.done[n].a) for n in SPEC.layers)
    assert math.isclose(float(strategy.prototypes()["count"].sum()), SPEC.num_classes)
