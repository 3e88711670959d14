"""Distributed noise's calibration and shares (``common/secagg/distributed_dp.py``): the setting's refusal without
secure aggregation, the Skellam sum's budget at the threshold, the rounding in the sensitivity, and one client's share
in the order its terms are masked."""

import math

import numpy as np
import pytest

from common.privacy.gaussian import calibrate
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.distributed_dp import GRAM_TERM, SUM_TERM, DistributedNoise, epsilon, releases_of
from common.secagg.noise import MAX_MEAN
from common.secagg.primitives import FixedPoint
from common.secagg.terms import fixed_point, run_encoding

DP = DpSettings(epsilon=1.0, clip=2.0, seed=7, mode="distributed")
SECAGG = SecAggSettings(enabled=True)
D, C, WIDTH = 6, 5, 6  # Gram width, classes, class-sum width
ENTRIES = (
    ("num_samples", ()),
    (GRAM_TERM, (D * (D + 1) // 2,)),
    ("sums/plain/class_count", (C,)),
    (SUM_TERM, (C, WIDTH)),
)


def test_distributed_mode_needs_secure_aggregation():
    settings = {"dp": {"epsilon": 1.0, "mode": "distributed"}}
    with pytest.raises(ValueError, match="dp.mode = distributed.*Set secagg.enabled=true"):
        RunConfig(method="ridge", settings=settings)
    RunConfig(method="ridge", settings=settings | {"secagg": {"enabled": True}})  # accepted
    with pytest.raises(ValueError, match="dp.mode must be one of central, distributed, local"):
        DpSettings(epsilon=1.0, mode="shared")


def test_without_distributed_mode_the_encoding_is_secure_aggregations_own():
    fp, noise = run_encoding(SECAGG, DpSettings(epsilon=1.0), 3)
    assert noise is None and fp == fixed_point(SECAGG, 3)


@pytest.mark.parametrize("eps", [0.5, 1.0, 8.0])
def test_a_sum_of_the_threshold_meets_the_budget_tightly_and_carries_at_least_the_gaussian_variance(eps):
    dp = DpSettings(epsilon=eps, clip=2.0, mode="distributed")
    noise = DistributedNoise(dp, SECAGG, 5, 3)
    releases = noise.layout_releases(ENTRIES)
    gaussian = calibrate(dp, ("gram", "class_sum"))
    for name, release in releases.items():
        assert release.variance >= gaussian[name].sigma ** 2
    assert epsilon(releases, noise.fp, dp.delta) == pytest.approx(eps, rel=1e-4)  # at t survivors: the budget
    assert noise.report(releases, 3)["epsilon"] <= eps * (1 + 1e-9)
    more = noise.report(releases, 5)
    assert more["epsilon"] < eps and more["variance"]["gram"] == pytest.approx(5 / 3 * releases["gram"].variance)


def test_the_grids_rounding_is_in_the_sensitivity():
    """On a coarse grid the rounding's sqrt(m) terms weigh: the same variance buys less privacy."""
    unit = releases_of(DP, ("gram", "class_sum"), (D, D), WIDTH, 1.0)
    fine, coarse = FixedPoint(frac_bits=13, bound=1.0), FixedPoint(frac_bits=0, bound=1.0)
    assert epsilon(unit, coarse, DP.delta) > 1.01 * epsilon(unit, fine, DP.delta)


def test_every_party_derives_the_same_fixed_point_and_its_grid_fits_the_sampler():
    a, b = DistributedNoise(DP, SECAGG, 3, 2), DistributedNoise(DP, SECAGG, 3, 2)
    assert a.fp == b.fp and a.fp.bound > SECAGG.bound
    releases = a.layout_releases(ENTRIES)
    largest = max(r.variance for r in releases.values()) / 2 * 4.0**a.fp.frac_bits
    assert 2.0**36 < largest <= 2 * MAX_MEAN  # fine (the rounding negligible) yet within the sampler's cap


def test_a_share_noises_the_tasks_rows_and_the_gram_symmetrically_in_the_layouts_order():
    noise = DistributedNoise(DP, SECAGG, 3, 2)
    share = noise.share(ENTRIES, (1, 3), b"ctx", 0)
    assert share.dtype == np.int64 and share.shape == (1 + D * (D + 1) // 2 + C + C * WIDTH,)
    at = 1 + D * (D + 1) // 2
    assert share[0] == 0 and not share[at : at + C].any()  # the public terms
    sums = share[at + C :].reshape(C, WIDTH)
    assert sums[1:3].all() and not sums[0].any() and not sums[3:].any()  # the task's rows only
    again = noise.share(ENTRIES, (1, 3), b"ctx", 0)
    assert np.array_equal(share, again)  # dp.seed: reproducible
    for other in (noise.share(ENTRIES, (1, 3), b"ctx", 1), noise.share(ENTRIES, (1, 3), b"ctx2", 0)):
        assert not np.array_equal(share, other)  # a fresh stream per client and per step
    secure = DistributedNoise(DpSettings(epsilon=1.0, clip=2.0, mode="distributed"), SECAGG, 3, 2)
    assert not np.array_equal(secure.share(ENTRIES, (1, 3), b"ctx", 0), secure.share(ENTRIES, (1, 3), b"ctx", 0))


def test_a_shares_gram_entries_have_the_central_mechanisms_shape():
    """Diagonal entries at V_G / t, off-diagonal at half that (the symmetric noise of central mode)."""
    d = 120
    entries = ((GRAM_TERM, (d * (d + 1) // 2,)), (SUM_TERM, (2, d)))
    noise = DistributedNoise(DP, SECAGG, 3, 2)
    share = noise.share(entries, (0, 2), b"ctx", 0)[: d * (d + 1) // 2] * 2.0**-noise.fp.frac_bits
    rows, cols = np.tril_indices(d)
    diagonal, off = share[rows == cols], share[rows != cols]
    v = noise.layout_releases(entries)["gram"].variance / 2  # the share's: V_G / t
    assert np.var(diagonal) == pytest.approx(v, rel=0.3)  # 120 entries
    assert np.var(off) == pytest.approx(v / 2, rel=0.05)  # 7,140 entries
    assert math.isclose(float(np.mean(off)), 0.0, abs_tol=4 * math.sqrt(v / 2 / off.size))


def test_a_term_no_release_covers_is_refused():
    noise = DistributedNoise(DP, SECAGG, 3, 2)
    with pytest.raises(Exception, match="no noise is calibrated for the terms"):
        noise.share(ENTRIES + (("sums/plain/holdout_class_sum", (C, WIDTH)),), (0, 1), b"ctx", 0)
