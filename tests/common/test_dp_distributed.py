"""Distributed noise's calibration and shares (``common/secagg/distributed_dp.py``): the setting's refusal without
secure aggregation, the Skellam sum's budget at the threshold, the rounding in the sensitivity, and one client's share
in the order its terms are masked."""

import math

import numpy as np
import pytest

from common.privacy.gaussian import calibrate
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.distributed_dp import (
    GRAM_TERM,
    GRID_CAP,
    HEADROOM,
    SUM_TERM,
    DistributedNoise,
    epsilon,
    releases_of,
)
from common.secagg.noise import MAX_MEAN, skellam_tv
from common.secagg.primitives import FixedPoint, SecAggError
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
    draws = noise.draws(ENTRIES, (0, C))
    assert noise.report(releases, 3, draws)["epsilon"] <= eps * (1 + 1e-9)
    more = noise.report(releases, 5, draws)
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


# ------------------------------------------------------------------------- colluders (dp.colluders)


def test_the_honest_shares_of_t_survivors_carry_v_when_k_colluders_take_theirs_out():
    """The attack: ``t`` survivors of whom ``k`` collude with the coordinator and subtract their own shares. What is
    left, the ``t - k`` honest shares, must still carry ``V`` on every entry: shares of ``V / (t - k)`` do (the
    estimate's sd is ``sqrt(2 / m)`` = 1%), shares of ``V / t`` would leave ``(t - k) / t = 1/2`` of it."""
    n, t, k = 5, 4, 2
    dp = DpSettings(epsilon=1.0, clip=2.0, seed=7, mode="distributed", colluders=k)
    noise = DistributedNoise(dp, SECAGG, n, t)
    entries = ((SUM_TERM, (40, 500)),)  # 20,000 noised entries
    shares = [noise.share(entries, (0, 40), b"ctx", i) for i in range(t)]  # clients 0 .. t-1 survive
    honest = sum(shares[k:]).astype(np.float64)  # clients 0 .. k-1 collude: their shares are known, taken out
    v = noise.layout_releases(entries)["class_sum"].variance * 4.0**noise.fp.frac_bits  # V in grid units
    ratio = float(honest.var()) / v
    assert ratio >= 0.95 and (t - k) / t < 0.95 / 1.5  # V / t shares fall below the bound by far
    assert ratio <= 1.05  # and the honest shares are not oversized either


def test_the_statement_is_the_honest_survivors_variance_and_its_epsilon():
    """``(|S| - k) V / (t - k)``: at ``t`` survivors exactly ``V`` and the whole budget (a statement of ``|S| V /
    (t - k)``, the colluders' shares counted, would claim a smaller epsilon); with every client ``(n - k) / (t - k)``
    times ``V``."""
    n, t, k = 5, 3, 1
    dp = DpSettings(epsilon=1.0, clip=2.0, mode="distributed", colluders=k)
    noise = DistributedNoise(dp, SECAGG, n, t)
    releases = noise.layout_releases(ENTRIES)
    draws = noise.draws(ENTRIES, (0, C))
    at_t = noise.report(releases, t, draws)
    assert at_t["variance"] == {name: r.variance for name, r in releases.items()}
    assert at_t["epsilon"] == pytest.approx(1.0, rel=1e-4) and at_t["colluders"] == k
    everyone = noise.report(releases, n, draws)
    assert everyone["variance"]["gram"] == pytest.approx((n - k) / (t - k) * releases["gram"].variance)
    assert everyone["epsilon"] == pytest.approx(epsilon(releases, noise.fp, dp.delta, (n - k) / (t - k)))


def test_the_grid_leaves_headroom_for_the_larger_shares_of_colluders():
    """``f`` is the most bits at which ``HEADROOM x sigma^2 / (t - k)`` fits the sampler's ``GRID_CAP``: with ``k``
    ignored, ``k = 7`` of ``t = 8`` would put shares 8 times the size on the grid chosen for ``V / t``."""
    largest = max(r.sigma**2 for r in calibrate(DP, ("gram", "class_sum")).values())
    bits = []
    for k in range(8):
        noise = DistributedNoise(DpSettings(epsilon=1.0, clip=2.0, mode="distributed", colluders=k), SECAGG, 9, 8)
        fits = HEADROOM * largest / (8 - k) * 4.0**noise.fp.frac_bits
        assert GRID_CAP / 4 < fits <= GRID_CAP  # the most bits that fit
        assert noise.fp.bound == SECAGG.bound + noise.share_tail * 2.0**-noise.fp.frac_bits
        assert noise.share(ENTRIES, (0, C), b"ctx", 0).any()  # drawn within the sampler's cap
        bits.append(noise.fp.frac_bits)
    assert bits[0] > bits[-1]


def test_colluders_at_or_above_the_threshold_are_refused_by_name():
    """The run's threshold resolved as the run resolves it (``secagg.threshold``, or the mode's majority)."""
    secure = {"secagg": {"enabled": True}}
    dp = {"epsilon": 1.0, "mode": "distributed"}
    with pytest.raises(ValueError, match=r"dp.colluders=2 must be below the secure aggregation threshold 2"):
        RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": dp | {"colluders": 2}})
    RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": dp | {"colluders": 1}})
    all_three = {"secagg": {"enabled": True, "threshold": 3}}
    RunConfig(method="ridge", num_clients=3, settings=all_three | {"dp": dp | {"colluders": 2}})
    signed = {"secagg": {"enabled": True, "mode": "signed"}}  # 5 clients: the signed mode's threshold is 4, not 3
    RunConfig(method="ridge", num_clients=5, settings=signed | {"dp": dp | {"colluders": 3}})
    with pytest.raises(ValueError, match=r"dp.colluders=3 must be below the secure aggregation threshold 3"):
        RunConfig(method="ridge", num_clients=5, settings=secure | {"dp": dp | {"colluders": 3}})
    with pytest.raises(ValueError, match="dp.colluders=1: colluding clients matter only"):
        RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": {"epsilon": 1.0, "colluders": 1}})
    with pytest.raises(ValueError, match="setting dp.colluders must be a non-negative integer"):
        DpSettings(epsilon=1.0, mode="distributed", colluders=-1)
    with pytest.raises(SecAggError, match=r"dp.colluders=2 must lie in \[0, 2\)"):
        DistributedNoise(DpSettings(epsilon=1.0, mode="distributed", colluders=2), SECAGG, 3, 2)


# ------------------------------------------------------------------------- the sampler's term in delta


def test_the_sampler_term_covers_every_entry_of_every_share_and_enters_delta():
    """``tv`` = survivors x (every noised entry's ``skellam_tv`` at its share's grid variance), counted here entry by
    entry from the layout: the task's class-sum rows at ``V_S / t``, the Gram's diagonal at ``V_G / t``, off it at
    half that, nothing on the public terms. One share's, or the Gram's alone, would fail it; ``delta`` adds it
    times ``1 + e^epsilon`` to the accountant's."""
    noise = DistributedNoise(DP, SECAGG, 5, 3)
    releases = noise.layout_releases(ENTRIES)
    grid = 4.0**noise.fp.frac_bits / 3
    v_s, v_g = releases["class_sum"].variance * grid, releases["gram"].variance * grid
    rows = (1, 3)
    per_entry = [v_g if r == c else v_g / 2 for r, c in zip(*np.tril_indices(D), strict=True)]
    per_entry += [v_s] * ((rows[1] - rows[0]) * WIDTH)
    one_share = sum(skellam_tv(v) for v in per_entry)
    nonzero = np.count_nonzero(noise.share(ENTRIES, rows, b"ctx", 0))
    assert nonzero == len(per_entry)  # the entries the share noises are those counted
    for survivors in (3, 4, 5):
        report = noise.report(releases, survivors, noise.draws(ENTRIES, rows))
        assert report["tv"] == pytest.approx(survivors * one_share, rel=1e-12)
        assert report["delta"] == pytest.approx(DP.delta + (1 + math.exp(report["epsilon"])) * report["tv"], rel=1e-12)
        assert report["delta_accountant"] == DP.delta and report["delta"] > DP.delta
    assert one_share > 1e-8  # 50 entries of about 3e-9 each: a term delta = 1e-5 must see at a head's width
