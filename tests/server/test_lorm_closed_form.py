"""LoRM's backbone with a closed-form head: the steps of each task, and the head equals the closed form.

The reference head is computed with generic torch (``torch.linalg.solve``) from feature rows
extracted by hand under the backbone the features step names, not with the strategy's helpers.
"""

import pytest
import torch

from client.features import extract, feature_map, random_projection
from client.runtime import build_runtime
from common.methods.checks import validate
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep, LoraStep
from common.wire.messages import LowRank, Phase
from common.wire.tensors import EXTRA, HEAD_WEIGHT, LORA
from engine.simulation import run_inprocess
from server.strategies import make_strategy

from tolerance import assert_close_to_dtype

ROUNDS = 2
TINY = dict(
    num_clients=3,
    num_tasks=2,
    beta=0.5,
    seed=3,
    threads=1,
    backbone="tiny-bert",
    rounds_per_task=ROUNDS,
    local_epochs=1,
    extra={"synthetic_classes": 8, "synthetic_train": 40, "synthetic_test": 10},
)
LAMBDA = 1.0  # fixed, so the reference is one solve


def tiny(strategy: str, **extra) -> RunConfig:
    return RunConfig(**{**TINY, "method": strategy, "extra": {**TINY["extra"], **extra}})


def recorded_run(config: RunConfig):
    """Run in process; return the result, the strategy and every plan handed to the clients (client 0's)."""
    plans = []

    class Recorded:
        def __init__(self, worker):
            self.worker = worker

        def handle(self, plan):
            plans.append(plan)
            return self.worker.handle(plan)

    result = run_inprocess(config, wrap=lambda i, worker: Recorded(worker) if i == 0 else worker)
    return result, result.strategy, plans


def same_view(got: dict[str, LowRank], want: dict[str, LowRank]) -> bool:
    """Equal factors, at the precision the plan carries them (plans may round float64 state to float32)."""
    return set(got) == set(want) and all(
        torch.equal(got[n].b, want[n].b.to(got[n].b.dtype)) and torch.equal(got[n].a, want[n].a.to(got[n].a.dtype))
        for n in want
    )


@pytest.mark.parametrize("name", ["lorm-ridge", "lorm-ncm"])
def test_lorm_then_a_features_step_under_the_merged_backbone(name):
    result, strategy, plans = recorded_run(tiny(name, rp_dim=48, ridge_lambda=LAMBDA))
    assert [len(row) for row in result.matrix.correct] == [1, 2]  # a full accuracy matrix
    per_task = ["train"] * ROUNDS + ["task_gram", "features", "evaluate"]
    assert [p.phase.value for p in plans] == per_task * 2
    assert [p.mode for p in plans] == (["lora"] * (ROUNDS + 1) + ["features", "features"]) * 2
    assert [p.expect(LoraStep).train_factors for p in plans[:ROUNDS]] == [("B",), ("A",)]
    for task in range(2):
        features, evaluation = plans[task * len(per_task) + ROUNDS + 1 : (task + 1) * len(per_task)]
        assert (features.task, features.round, features.get(HEAD_WEIGHT)) == (task, ROUNDS, None)
        assert features.expect(FeaturesStep).head_gram == (name == "lorm-ridge") and features.low_rank(LORA) == {}
        extra = features.low_rank(EXTRA)
        assert same_view(extra, evaluation.low_rank(EXTRA))  # the statistics' view is the one evaluated
        assert len(extra) == len(strategy.spec.layers)
        assert next(iter(extra.values())).b.shape[1] == task + 1  # B_cat of tasks 0..t: rank r (t+1)
    assert same_view(plans[-1].low_rank(EXTRA), strategy.view())
    assert strategy.task_factors and len(strategy.task_factors) == 2
    assert tuple(result.head_weight.shape) == (8, 48) and torch.equal(result.head_weight, strategy.closed.head_w)
    # LoRM's rounds train with the ACE head (C, F), never with the closed-form one
    assert all(tuple(p.get(HEAD_WEIGHT).shape) == (8, strategy.spec.feature_dim) for p in plans if p.mode == "lora")


def test_first_task_only_adapts_then_freezes_and_the_head_is_the_ridge_solution():
    config = tiny("lorm-ridge-first", rp_dim=48, ridge_lambda=LAMBDA)
    result, strategy, plans = recorded_run(config)
    assert [len(row) for row in result.matrix.correct] == [1, 2]
    steps = [(p.task, p.phase.value, p.round, p.mode, p.instruction.factors()) for p in plans]
    assert steps == [
        (0, "train", 0, "lora", "B"),
        (0, "train", 1, "lora", "A"),
        (0, "task_gram", ROUNDS, "lora", ""),
        (0, "features", ROUNDS, "features", ""),
        (0, "evaluate", ROUNDS, "features", ""),
        (1, "features", ROUNDS, "features", ""),
        (1, "evaluate", ROUNDS, "features", ""),
    ]
    assert len(strategy.task_factors) == 1
    frozen = {n: LowRank(f.b * config.lora_scale, f.a) for n, f in strategy.task_factors[0].items()}
    for p in plans[3:]:
        assert same_view(p.low_rank(EXTRA), frozen)  # W0 + B^0 A^0 from task 1 on, for statistics and evaluation

    # Reference: every client's rows of both tasks under W0 + B^0 A^0, solved with torch.linalg.solve.
    runtime = build_runtime(config)
    workers = [runtime.worker(i, f"c{i}") for i in range(config.num_clients)]
    workers[0].load_view(plans[3])  # the features step's view, on the shared model
    projection = random_projection(config, runtime.spec.feature_dim)
    # Each client's rows extracted in its own batches, as the client does: the same float32 features on any CPU.
    idx = torch.cat([w.shards[t] for t in range(2) for w in workers])
    x = torch.cat(
        [
            feature_map(extract(runtime.model, runtime.train, w.shards[t], runtime.device), projection)
            for t in range(2)
            for w in workers
        ]
    )  # (n, F')
    y = torch.nn.functional.one_hot(runtime.train.labels[idx], 8).double()  # (n, C)
    system = x.T @ x + LAMBDA * torch.eye(48, dtype=torch.float64)
    want = torch.linalg.solve(system, x.T @ y).T
    # Only float64 summation order differs (clients' sums vs one product), amplified by the solve.
    assert_close_to_dtype(
        result.head_weight, want, torch.float64, terms=idx.numel(), cond=float(torch.linalg.cond(system))
    )
    evaluated = plans[-1].get(HEAD_WEIGHT)
    assert torch.equal(evaluated, result.head_weight.to(evaluated.dtype))  # the head evaluated


def test_restart_from_state_keeps_both_heads_and_the_sums():
    config = tiny("lorm-ridge", rp_dim=16)
    _, straight, _ = recorded_run(config.replace(num_tasks=1))
    restarted = make_strategy(validate(config.replace(num_tasks=1)), straight.spec)  # rp_dim placed as a run's
    restarted.load_state_tensors(straight.state_tensors())
    for attr in ("head_w", "head_b", "ace_w", "ace_b"):
        assert torch.equal(getattr(restarted, attr), getattr(straight, attr)), attr
    assert restarted.closed.lam == straight.closed.lam
    assert all(torch.equal(restarted.closed.totals.value()[n], t) for n, t in straight.closed.totals.value().items())
    assert same_view(restarted.view(), straight.view())


def test_first_task_only_refuses_training_steps_later():
    config = tiny("lorm-ridge-first")
    strategy = make_strategy(config, build_runtime(config).spec)
    assert strategy.steps(1) == [(Phase.FEATURES, ROUNDS)]
    with pytest.raises(ValueError, match="task 0 only"):
        strategy.configure(1, 0, Phase.TRAIN)
