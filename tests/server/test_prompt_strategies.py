"""L2P and CODA-Prompt on the coordinator: the pool's initialisation, growth and FedAvg merge."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_baselines import SPEC as BASELINES_SPEC

from common.adapters.prompts import CODA_ATTENTION, CODA_KEYS, CODA_PROMPTS, L2P_KEYS, L2P_PROMPTS, orthonormal_rows
from common.aggregation.declared import declared_tensors
from common.run.config import RunConfig
from common.wire.instructions import Mode, PromptStep
from common.wire.messages import Phase
from common.wire.tensors import DELTA, HEAD_BIAS, HEAD_WEIGHT, PROMPT, tensor_name
from server.strategies import make_strategy

from updates import plan_update

EPS = torch.finfo(torch.float64).eps
SPEC = dataclasses.replace(BASELINES_SPEC, feature_dim=8)  # room for 6 orthonormal keys


def config(method: str, **settings) -> RunConfig:
    section = "l2p" if method == "l2p" else "coda"
    return RunConfig(num_clients=2, num_tasks=2, rounds_per_task=1, seed=4, method=method, settings={section: settings})


def test_orthonormal_rows_are_orthogonal_to_the_old_ones_and_each_other():
    gen = torch.Generator().manual_seed(0)
    old = torch.randn(5, 12, generator=gen, dtype=torch.float64)  # trained rows: not orthogonal
    new = orthonormal_rows(old, 4, gen)
    tol = 100 * EPS * 12
    assert new.shape == (4, 12)
    assert (new @ old.T).abs().max() < tol * old.norm(dim=1).max()
    assert torch.allclose(new @ new.T, torch.eye(4, dtype=torch.float64), atol=tol)


def test_orthonormal_rows_when_the_space_is_full_keeps_unit_draws():
    gen = torch.Generator().manual_seed(1)
    new = orthonormal_rows(torch.randn(3, 4, generator=gen, dtype=torch.float64), 3, gen)  # 3 + 3 > 4
    assert torch.isfinite(new).all()
    assert torch.allclose(new.norm(dim=1), torch.ones(3, dtype=torch.float64))


def test_l2p_pool_is_uniform_and_handed_out_whole_every_task():
    strategy = make_strategy(config("l2p", pool=6, length=3), SPEC)
    pool = strategy.pool
    assert pool[L2P_PROMPTS].shape == (6, 3, SPEC.feature_dim) and pool[L2P_KEYS].shape == (6, SPEC.feature_dim)
    assert all(t.min() >= -1 and t.max() <= 1 and t.abs().max() > 0.9 for t in pool.values())
    small = make_strategy(config("l2p", pool=6, length=3, init=0.05), SPEC).pool  # l2p.init: the bound
    assert all(t.abs().max() <= 0.05 and t.abs().max() > 0.04 for t in small.values())
    for task in (0, 1):
        strategy.begin_task(task)
        plan = strategy.configure(task, 0, Phase.TRAIN)
        assert plan.mode == Mode.PROMPT and plan.expect(PromptStep).prompt_frozen == 0
        assert all(torch.equal(plan.named(PROMPT)[n], pool[n].float()) for n in pool)
        assert declared_tensors(plan, SPEC, strategy.config).keys() >= {
            tensor_name(DELTA, L2P_PROMPTS),
            tensor_name(DELTA, L2P_KEYS),
        }


def test_l2p_merge_is_the_sample_weighted_mean_of_the_changes_and_heads():
    strategy = make_strategy(config("l2p", pool=4, length=2, top_k=2), SPEC)
    strategy.begin_task(0)
    before = {n: t.clone() for n, t in strategy.pool.items()}
    plan = strategy.configure(0, 0, Phase.TRAIN)
    fold = strategy.fold(plan)
    agg = fold.aggregator
    gen = torch.Generator().manual_seed(2)
    updates = []
    for i, n in enumerate((3, 9)):
        delta = {name: torch.randn(t.shape, generator=gen) for name, t in plan.named(PROMPT).items()}
        head = torch.randn(SPEC.num_classes, SPEC.feature_dim, generator=gen)
        bias = torch.randn(SPEC.num_classes, generator=gen)
        updates.append((n, delta, head, bias))
        agg.fold(plan_update(plan, i, n, delta=delta, head_weight=head, head_bias=bias))
    fold.finish()
    for name in before:
        want = before[name] + sum(n * d[name].double() for n, d, _, _ in updates) / 12
        assert torch.allclose(strategy.pool[name], want, rtol=0, atol=1e3 * EPS)
    assert torch.allclose(strategy.head_w, sum(n * h.double() for n, _, h, _ in updates) / 12, atol=1e3 * EPS)


def test_coda_grows_orthonormal_components_per_task_and_freezes_the_old_ones():
    strategy = make_strategy(config("coda-p", components=6, length=2), SPEC)  # 3 per task
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    prompt = plan.named(PROMPT)
    assert plan.expect(PromptStep).prompt_frozen == 0 and prompt[CODA_PROMPTS].shape == (3, 2, SPEC.feature_dim)
    # a round of training moves the task's components
    fold = strategy.fold(plan)
    agg = fold.aggregator
    delta = {name: torch.full(t.shape, 0.5) for name, t in prompt.items()}
    head = {"head_weight": plan.get(HEAD_WEIGHT), "head_bias": plan.get(HEAD_BIAS)}
    agg.fold(plan_update(plan, 0, 5, delta=delta, **head))
    fold.finish()
    trained = {n: t.clone() for n, t in strategy.pool.items()}
    strategy.begin_task(1)
    strategy.begin_task(1)  # again, as a resumed coordinator may: grows once
    plan = strategy.configure(1, 0, Phase.TRAIN)
    assert plan.expect(PromptStep).prompt_frozen == 3
    for name, old in trained.items():
        pool = strategy.pool[name]
        assert pool.shape[0] == 6 and torch.equal(pool[:3], old)
        new = pool[3:].flatten(1)
        assert torch.allclose(new @ new.T, torch.eye(3, dtype=torch.float64), atol=1e3 * EPS)
        assert (new @ old.flatten(1).T).abs().max() < 1e3 * EPS * old.norm()
    # clients send the new components only; the merge leaves the old ones bit-identical
    declared = declared_tensors(plan, SPEC, strategy.config)
    assert declared[tensor_name(DELTA, CODA_KEYS)] == (3, SPEC.feature_dim)
    assert declared[tensor_name(DELTA, CODA_ATTENTION)] == (3, SPEC.feature_dim)
    fold = strategy.fold(plan)
    agg = fold.aggregator
    delta = {name: torch.ones(3, *t.shape[1:]) for name, t in plan.named(PROMPT).items()}
    agg.fold(plan_update(plan, 1, 4, delta=delta, **head))
    before = {n: t.clone() for n, t in strategy.pool.items()}
    fold.finish()
    for name, pool in strategy.pool.items():
        assert torch.equal(pool[:3], before[name][:3]) and torch.equal(pool[3:], before[name][3:] + 1)


def test_coda_needs_a_component_per_task():
    with pytest.raises(ValueError, match="at least the number of tasks"):
        make_strategy(config("coda-p", components=1), SPEC)


def test_prompt_state_survives_a_restart():
    strategy = make_strategy(config("coda-p", components=4), SPEC)
    strategy.begin_task(0)
    again = make_strategy(config("coda-p", components=4), SPEC)
    again.load_state_tensors(strategy.state_tensors())
    assert again.pool.keys() == strategy.pool.keys()
    assert all(torch.equal(again.pool[n], strategy.pool[n]) for n in strategy.pool)
