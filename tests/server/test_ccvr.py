"""CCVR: the merged per-class Gaussians are the centralised ones, the virtual features have
their moments, and the calibration step re-trains the head on them."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_baselines import SPEC as BASELINES_SPEC

from common.aggregation.validate import UpdateRejected
from common.methods.ccvr import CcvrSettings
from common.run.config import RunConfig
from common.wire.instructions import FeaturesStep, Mode
from common.wire.messages import Phase
from common.wire.tensors import DELTA
from server.strategies import make_strategy
from server.strategies.ccvr import calibrate, gaussians, sampling_factor, virtual_features

from updates import plan_update

F64 = torch.float64
EPS = torch.finfo(F64).eps
SPEC = dataclasses.replace(BASELINES_SPEC, feature_dim=3)


def client_stats(x: torch.Tensor, y: torch.Tensor, classes: int, full: bool) -> dict[str, torch.Tensor]:
    one_hot = torch.nn.functional.one_hot(y, classes).to(F64)
    moment = torch.einsum("nc,nf,ng->cfg", one_hot, x, x) if full else one_hot.T @ (x * x)
    return {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0), "class_moment": moment}


@pytest.mark.parametrize("full", [True, False])
def test_merged_gaussians_equal_the_centralised_ones(full):
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(60, 4, generator=gen, dtype=F64) * torch.tensor([1.0, 2.0, 0.5, 3.0], dtype=F64) + 5.0
    y = torch.arange(60) % 2
    parts = [slice(0, 7), slice(7, 31), slice(31, 60)]  # three clients, unequal shares
    stats = [client_stats(x[p], y[p], 2, full) for p in parts]
    total = {name: sum(s[name] for s in stats) for name in stats[0]}
    mean, cov = gaussians(total["class_sum"], total["class_count"], total["class_moment"])
    for c in range(2):
        xc = x[y == c]
        assert torch.allclose(mean[c], xc.mean(0), rtol=0, atol=100 * EPS * 5)
        want = torch.cov(xc.T)
        tol = 1e3 * EPS * float(xc.square().sum())  # sums of squares cancel against the mean's
        assert torch.allclose(cov[c], want if full else want.diagonal(), rtol=0, atol=tol)


@pytest.mark.parametrize("full", [True, False])
def test_virtual_features_have_the_merged_moments(full):
    mean = torch.tensor([[1.0, -2.0, 0.5]], dtype=F64)
    a = torch.tensor([[2.0, 0.0, 0.0], [0.6, 1.0, 0.0], [-0.4, 0.3, 0.5]], dtype=F64)
    cov = (a @ a.T)[None] if full else torch.tensor([[4.0, 1.0, 0.25]], dtype=F64)
    n = 40_000
    x = virtual_features(mean, sampling_factor(cov), n, torch.Generator().manual_seed(1))[0]
    sd = cov[0].diagonal().sqrt() if full else cov[0].sqrt()
    assert ((x.mean(0) - mean[0]).abs() < 5 * sd / n**0.5).all()  # 5 standard errors
    sample_cov = torch.cov(x.T)
    want = cov[0] if full else torch.diag(cov[0])
    assert torch.allclose(sample_cov, want, rtol=0, atol=float(5 * sd.max() ** 2 * (2 / n) ** 0.5))


def test_a_singular_covariance_still_samples():
    x = torch.randn(2, 5, generator=torch.Generator().manual_seed(2), dtype=F64)  # 2 samples in 5 dimensions
    stats = client_stats(x, torch.zeros(2, dtype=torch.long), 1, True)
    mean, cov = gaussians(stats["class_sum"], stats["class_count"], stats["class_moment"])
    draws = virtual_features(mean, sampling_factor(cov), 100, torch.Generator().manual_seed(3))
    assert torch.isfinite(draws).all()


def test_calibration_separates_the_classes_the_head_confused():
    mean = torch.tensor([[3.0, 0.0, 0.0], [0.0, 3.0, 0.0], [0.0, 0.0, 3.0]], dtype=F64)
    cov = torch.eye(3, dtype=F64).expand(3, 3, 3) * 0.25
    weight = torch.tensor([[0.0, 0.0, 1.0]] * 3, dtype=F64)  # every class scores alike: biased to none
    bias = torch.tensor([0.0, 0.0, 1.0], dtype=F64)  # ... but the last class wins everywhere
    w, b = calibrate(weight, bias, mean, sampling_factor(cov), CcvrSettings(), torch.Generator().manual_seed(4))
    test = virtual_features(mean, sampling_factor(cov), 200, torch.Generator().manual_seed(5))
    pred = (test.reshape(-1, 3) @ w.T + b).argmax(1)
    assert (pred == torch.arange(3).repeat_interleave(200)).double().mean() > 0.95


def test_the_strategy_adds_a_features_step_keeps_every_seen_gaussian_and_calibrates():
    config = RunConfig(num_clients=2, num_tasks=2, rounds_per_task=1, seed=3, method="ccvr")
    strategy = make_strategy(config, SPEC)
    assert strategy.steps(0) == [(Phase.TRAIN, 0), (Phase.FEATURES, 1)]
    gen = torch.Generator().manual_seed(6)
    for task, (lo, hi) in enumerate(strategy.tasks):
        strategy.begin_task(task)
        plan = strategy.configure(task, 1, Phase.FEATURES)
        delta = plan.named(DELTA)  # the strategy's own tensors, not copies
        assert plan.mode == Mode.FEATURES and not plan.expect(FeaturesStep).send_head
        assert delta.keys() == strategy.delta.keys() and all(delta[n] is strategy.delta[n] for n in delta)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        for i in range(2):
            x = torch.randn(8, SPEC.feature_dim, generator=gen, dtype=F64) + 3 * torch.arange(SPEC.feature_dim)
            stats = client_stats(x, torch.arange(8) % (hi - lo), hi - lo, True)
            agg.fold(plan_update(plan, i, 8, stats=stats))
        before = strategy.head_w.clone()
        fold.finish()
        assert strategy.mean.shape[0] == hi and strategy.cov.shape == (hi, SPEC.feature_dim, SPEC.feature_dim)
        assert not torch.equal(strategy.head_w[:hi], before[:hi])
        assert torch.equal(strategy.head_w[hi:], before[hi:].to(F64))  # unseen classes untouched
    again = make_strategy(config, SPEC)
    again.load_state_tensors(strategy.state_tensors())
    assert torch.equal(again.cov, strategy.cov) and torch.equal(again.mean, strategy.mean)


@pytest.mark.parametrize("full", [True, False])
def test_second_moments_below_the_means_are_refused(full):
    """A hostile client's second moments below what its class sums imply (``M_c < S_c S_c^T / n_c``: a negative
    covariance, which no samples give) are refused at the fold; folded, the merge could not sample the class (a
    covariance with no Cholesky factor at any shift), and one client would halt the run. Honest moments of a class
    of one sample, where the two are equal, pass."""
    ccvr = {"ccvr": {"covariance": "full" if full else "diag"}}
    config = RunConfig(num_clients=2, num_tasks=2, rounds_per_task=1, seed=3, method="ccvr", settings=ccvr)
    strategy = make_strategy(config, SPEC)
    strategy.begin_task(0)
    lo, hi = strategy.tasks[0]
    plan = strategy.configure(0, 1, Phase.FEATURES)
    gen = torch.Generator().manual_seed(7)
    x = torch.randn(8, SPEC.feature_dim, generator=gen, dtype=F64) + 3 * torch.arange(SPEC.feature_dim)
    y = torch.arange(8) % (hi - lo)
    strategy.aggregator(plan).fold(plan_update(plan, 0, 8, stats=client_stats(x, y, hi - lo, full)))  # honest
    single = client_stats(x[:1], y[:1], hi - lo, full)  # one sample: the moment equals S S^T / n
    strategy.aggregator(plan).fold(plan_update(plan, 0, 1, stats=single))
    hostile = client_stats(x, y, hi - lo, full)
    hostile["class_moment"] = 0.5 * hostile["class_moment"]  # still positive semidefinite, but below the means
    with pytest.raises(UpdateRejected, match="class_moment") as err:
        strategy.aggregator(plan).fold(plan_update(plan, 1, 8, stats=hostile))
    assert "below" in str(err.value)
