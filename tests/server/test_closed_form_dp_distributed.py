"""Distributed DP on the closed-form heads (``dp.mode = distributed``): the clients' discrete Gaussian shares, added
before masking, give the securely aggregated sum the calibrated variance; a dropped client's missing share is stated;
the coordinator adds nothing, and the in-process run repeats with its seed."""

import math

import pytest
import torch
from test_closed_form import VARIANTS, tiny

from client.features import feature_map
from common.merges.grams import gram_factor
from common.privacy.gaussian import calibrate
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.wire.messages import ModelSpec, Phase
from engine.simulation import run_inprocess
from lab.secure_rounds import secure_step
from server.strategies import make_strategy

from updates import plan_update

WIDE = ModelSpec(layers={}, feature_dim=40, num_classes=6)
DP = {"epsilon": 1.0, "seed": 11, "clip": 2.0}
DISTRIBUTED = {"dp": DP | {"mode": "distributed"}, "secagg": {"enabled": True}}
DP_DELTA = DpSettings().delta
PLAIN = {"ridge": {"fixed_lambda": 1.0, "holdout": 0}, "secagg": {"enabled": True}}  # what a private step sends


def client_update(plan, index):
    """Client ``index``'s statistics of 12 random rows of norm about 6, clipped to ``dp.clip``."""
    gen = torch.Generator().manual_seed(40 + index)
    lo, hi = plan.class_range
    y = torch.randint(lo, hi, (12,), generator=gen)
    x = feature_map(torch.randn(12, WIDE.feature_dim, generator=gen, dtype=torch.float64), None, clip=DP["clip"])
    one_hot = torch.nn.functional.one_hot(y - lo, hi - lo).double()
    stats = {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0), "gram_factor": gram_factor(x)}
    return plan_update(plan, index, 12, stats=stats)


def secure_task(settings: dict, drop: tuple[int, ...] = ()):
    """Task 0's features step of three clients through secure aggregation (``drop``: vanish after sharing); the
    head after it, and the step's summed class sums and Gram."""
    head = make_strategy(RunConfig(method="ridge", num_clients=3, num_tasks=2, settings=settings), WIDE)
    head.begin_task(0)
    plan = head.configure(0, 0, Phase.FEATURES)
    updates = {i: client_update(plan, i) for i in range(3)}
    fold = head.fold(plan)
    aggregator = fold.aggregator
    secure_step(aggregator, WIDE, head.config, updates, SecAggSettings(enabled=True), 3, drop_after_sharing=drop)
    sums = aggregator.sums.plain["class_sum"].clone(), aggregator.sums.grams["gram"].value().clone()
    fold.finish()
    return head, plan, sums


@pytest.mark.parametrize("drop", [(), (2,)])
def test_the_summed_noise_has_the_calibrated_variance_and_the_statement_says_what_it_carried(drop):
    """The same statistics securely summed with and without the shares: the difference's variance over the task's
    class-sum rows, the Gram's diagonal and off it is ``|S| / t`` times the calibrated ``V`` (off the diagonal half
    of it), whether all three clients survive or one drops (then ``|S| = t``: exactly ``V``, still at least the
    Gaussian's ``sigma^2``). Shares off by a factor 2 fail it."""
    noisy_head, plan, (noisy_sum, noisy_gram) = secure_task(DISTRIBUTED, drop)
    _, _, (plain_sum, plain_gram) = secure_task(PLAIN, drop)
    survivors = 3 - len(drop)
    lo, hi = plan.class_range
    assert torch.equal(noisy_sum[hi:], plain_sum[hi:]) and torch.equal(noisy_sum[:lo], plain_sum[:lo])
    releases = noisy_head.private.shared
    carried = survivors / 2  # threshold 2 of 3
    class_noise = (noisy_sum - plain_sum)[lo:hi].flatten()  # 120 entries
    gram_noise = noisy_gram - plain_gram
    assert torch.equal(gram_noise, gram_noise.T)
    rows, cols = torch.tril_indices(40, 40, -1)
    off, diagonal = gram_noise[rows, cols], gram_noise.diagonal()  # 780 and 40 entries
    assert float(class_noise.var()) == pytest.approx(carried * releases["class_sum"].variance, rel=0.35)
    assert float(off.var()) == pytest.approx(carried * releases["gram"].variance / 2, rel=0.2)
    assert float(diagonal.var()) == pytest.approx(carried * releases["gram"].variance, rel=0.5)

    report = noisy_head.step_report(plan)["dp"]
    assert report["mode"] == "distributed" and report["survivors"] == survivors
    gaussian = calibrate(DpSettings(**DP), ("gram", "class_sum"))
    for name, variance in report["variance"].items():
        assert variance == pytest.approx(carried * releases[name].variance)
        assert variance >= gaussian[name].sigma ** 2
    assert report["epsilon"] <= DP["epsilon"] * (1 + 1e-9)
    if drop:  # at the threshold: the whole budget
        assert report["epsilon"] == pytest.approx(DP["epsilon"], rel=1e-3)


def test_the_coordinator_adds_no_noise_of_its_own():
    """Every share is the clients': with the clients' seed fixed, two coordinators unmask the same sum and solve the
    same head (central mode's coordinator would draw its own noise from ``noise_source(seed, task)``)."""
    first, _, sums = secure_task(DISTRIBUTED)
    again, _, sums_again = secure_task(DISTRIBUTED | {"dp": DP | {"mode": "distributed", "lambda_scale": 2.0}})
    assert all(torch.equal(a, b) for a, b in zip(sums, sums_again, strict=True))
    assert torch.equal(first.head_w, again.head_w)
    total = first.totals.value()
    assert torch.equal(total["class_sum"], sums[0]) and torch.equal(total["gram"], sums[1])  # nothing added


@pytest.mark.parametrize("method", ["ridge", "ncm"])
def test_a_distributed_run_repeats_with_its_seed_and_states_its_mode(method):
    lines: list[str] = []
    first = run_inprocess(tiny(method, settings=DISTRIBUTED), log=lines.append)
    again = run_inprocess(tiny(method, settings=DISTRIBUTED))
    other = run_inprocess(tiny(method, settings=DISTRIBUTED | {"dp": DP | {"mode": "distributed", "seed": 12}}))
    central = run_inprocess(tiny(method, settings={"dp": DP, "secagg": {"enabled": True}}))
    assert torch.equal(first.head_weight, again.head_weight)
    assert not torch.equal(first.head_weight, other.head_weight)
    assert not torch.equal(first.head_weight, central.head_weight)
    features = [line for line in lines if " features " in line and "merged" in line]
    assert len(features) == 2 and all(
        "dp_mode distributed" in line and "dp_variance_class_sum" in line for line in features
    )
    privacy = first.summary()["privacy"]
    assert privacy["mode"] == "distributed" and privacy["epsilon"] <= 1.0
    assert all(step["survivors"] == 3 and step["variance"]["class_sum"] > 0 for step in privacy["steps"])
    assert math.isclose(privacy["epsilon"], first.history[0]["dp"]["epsilon"], rel_tol=1e-6)


@pytest.mark.parametrize("variant", ["ridge-blocks", "ridge-layers", "ncm-layers"])
def test_the_heads_variants_take_their_shares_on_their_own_shapes(variant):
    """The ensemble's ``(K, d(d+1)/2)`` packed Gram blocks and the layer variants' widths: calibrated from the
    layout, a finite head, every step at most the budget."""
    method, extra = VARIANTS[variant]
    extra = dict(extra)
    settings = extra.pop("settings", {}) | DISTRIBUTED
    result = run_inprocess(tiny(method, settings=settings, **extra))
    assert bool(torch.isfinite(result.head_weight).all())
    steps = result.summary()["privacy"]["steps"]
    assert len(steps) == 2 and all(0 < step["epsilon"] <= 1.0 for step in steps)


@pytest.mark.parametrize("drop", [(), (2,)])
def test_the_steps_statement_names_the_mechanism_and_the_accountants_delta(drop):
    """The history's ``dp`` entry: the discrete Gaussian, ``delta`` (flat ``dp_delta``, the log's and
    metrics.json's) the accountant's exactly, with no sampler's term (the sampler is exact), and ``log tau`` of the
    survivors' shares per statistic, far below float64's least exponent."""
    head, plan, _ = secure_task(DISTRIBUTED, drop)
    entry = head.step_report(plan)
    report = entry["dp"]
    assert report["mode"] == "distributed" and report["mechanism"] == "discrete_gaussian"
    assert report["delta"] == DP_DELTA and entry["dp_delta"] == DP_DELTA and "tv" not in report
    assert set(report["log_tau"]) == {"gram", "class_sum"} and all(v < -1e6 for v in report["log_tau"].values())
    assert report["survivors"] == 3 - len(drop) and report["colluders"] == 0


def test_a_run_states_the_accountants_delta_in_its_summary():
    result = run_inprocess(tiny("ridge", settings=DISTRIBUTED))
    privacy = result.summary()["privacy"]
    steps = [entry for entry in result.history if "dp" in entry]
    assert privacy["delta"] == DP_DELTA == max(entry["dp"]["delta"] for entry in steps)
    assert all(step["delta"] == DP_DELTA and step["log_tau"]["class_sum"] < -1e6 for step in privacy["steps"])


def test_with_a_colluder_the_clients_shares_are_sized_for_the_honest_survivors():
    """``dp.colluders = 1`` of threshold 2: each client's share is ``V / (t - k) = V``, so the three shares in the sum
    carry ``3 V`` (``V / t`` shares would carry 1.5 V), and the statement is what the two honest ones carry, ``2 V``."""
    settings = DISTRIBUTED | {"dp": DP | {"mode": "distributed", "colluders": 1}}
    noisy_head, plan, (noisy_sum, _) = secure_task(settings)
    _, _, (plain_sum, _) = secure_task(PLAIN)
    lo, hi = plan.class_range
    v = noisy_head.private.shared["class_sum"].variance
    assert float((noisy_sum - plain_sum)[lo:hi].var()) == pytest.approx(3 * v, rel=0.35)  # 120 entries
    report = noisy_head.step_report(plan)["dp"]
    assert report["colluders"] == 1 and report["variance"]["class_sum"] == pytest.approx(2 * v)
