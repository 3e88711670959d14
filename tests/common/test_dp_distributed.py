"""Distributed noise's calibration and shares (``common/secagg/distributed_dp.py``): the setting's refusal without
secure aggregation, the distributed discrete Gaussian's budget at the threshold (against an independent evaluation of
Kairouz, Liu, Steinke 2021), the rounding in the sensitivity, one client's share in the order its terms are masked,
and a statement with no sampler's term."""

import math

import numpy as np
import pytest

from common.methods.checks import validate
from common.privacy.gaussian import calibrate
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.distributed_dp import (
    GRAM_TERM,
    GRID_CAP,
    HEADROOM,
    ORDERS,
    SUM_TERM,
    DistributedNoise,
    DistributedRelease,
    epsilon,
    releases_of,
)
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
        validate(RunConfig(method="ridge", settings=settings))
    validate(RunConfig(method="ridge", settings=settings | {"secagg": {"enabled": True}}))  # accepted
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
    assert epsilon(releases, noise.fp, dp.delta, shares=3) == pytest.approx(eps, rel=1e-4)  # at t: the budget
    assert noise.report(releases, 3)["epsilon"] <= eps * (1 + 1e-9)
    more = noise.report(releases, 5)
    assert more["epsilon"] < eps and more["variance"]["gram"] == pytest.approx(5 / 3 * releases["gram"].variance)


def test_the_grids_rounding_is_in_the_sensitivity():
    """On a coarse grid the rounding's sqrt(m) terms weigh: the same variance buys less privacy."""
    unit = releases_of(DP, ("gram", "class_sum"), (D, D), WIDTH, 1.0)
    fine, coarse = FixedPoint(frac_bits=13, bound=1.0), FixedPoint(frac_bits=0, bound=1.0)
    assert epsilon(unit, coarse, DP.delta, shares=2) > 1.01 * epsilon(unit, fine, DP.delta, shares=2)


def test_every_party_derives_the_same_fixed_point_and_its_grid_fits_the_sampler():
    a, b = DistributedNoise(DP, SECAGG, 3, 2), DistributedNoise(DP, SECAGG, 3, 2)
    assert a.fp == b.fp and a.fp.bound > SECAGG.bound
    releases = a.layout_releases(ENTRIES)
    largest = max(r.variance for r in releases.values()) / 2 * 4.0**a.fp.frac_bits
    assert 2.0**36 < largest <= GRID_CAP  # fine (the rounding negligible) yet within the grid's cap


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
    """Diagonal entries at V_G / t, off-diagonal at half that (the symmetric noise of central mode): the diagonal's
    variance over 8 steps' shares (960 entries, a standard error of 4.6%), the rest over one's (7,140 entries)."""
    d = 120
    entries = ((GRAM_TERM, (d * (d + 1) // 2,)), (SUM_TERM, (2, d)))
    noise = DistributedNoise(DP, SECAGG, 3, 2)
    shares = [noise.share(entries, (0, 2), b"ctx %d" % i, 0)[: d * (d + 1) // 2] for i in range(8)]
    rows, cols = np.tril_indices(d)
    diagonal = np.concatenate([share[rows == cols] for share in shares]) * 2.0**-noise.fp.frac_bits
    off = shares[0][rows != cols] * 2.0**-noise.fp.frac_bits
    v = noise.layout_releases(entries)["gram"].variance / 2  # the share's: V_G / t
    assert np.var(diagonal) == pytest.approx(v, rel=0.2)  # v / 2 (the off-diagonal's) fails
    assert np.var(off) == pytest.approx(v / 2, rel=0.05)
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
    at_t = noise.report(releases, t)
    assert at_t["variance"] == {name: r.variance for name, r in releases.items()}
    assert at_t["epsilon"] == pytest.approx(1.0, rel=1e-4) and at_t["colluders"] == k
    everyone = noise.report(releases, n)
    assert everyone["variance"]["gram"] == pytest.approx((n - k) / (t - k) * releases["gram"].variance)
    assert everyone["epsilon"] == pytest.approx(epsilon(releases, noise.fp, dp.delta, (n - k) / (t - k), shares=n - k))


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
        validate(RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": dp | {"colluders": 2}}))
    validate(RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": dp | {"colluders": 1}}))
    all_three = {"secagg": {"enabled": True, "threshold": 3}}
    validate(RunConfig(method="ridge", num_clients=3, settings=all_three | {"dp": dp | {"colluders": 2}}))
    signed = {"secagg": {"enabled": True, "mode": "signed"}}  # 5 clients: the signed mode's threshold is 4, not 3
    validate(RunConfig(method="ridge", num_clients=5, settings=signed | {"dp": dp | {"colluders": 3}}))
    with pytest.raises(ValueError, match=r"dp.colluders=3 must be below the secure aggregation threshold 3"):
        validate(RunConfig(method="ridge", num_clients=5, settings=secure | {"dp": dp | {"colluders": 3}}))
    with pytest.raises(ValueError, match="dp.colluders=1: colluding clients matter only"):
        validate(RunConfig(method="ridge", num_clients=3, settings=secure | {"dp": {"epsilon": 1.0, "colluders": 1}}))
    with pytest.raises(ValueError, match="setting dp.colluders must be a non-negative integer"):
        DpSettings(epsilon=1.0, mode="distributed", colluders=-1)
    with pytest.raises(SecAggError, match=r"dp.colluders=2 must lie in \[0, 2\)"):
        DistributedNoise(DpSettings(epsilon=1.0, mode="distributed", colluders=2), SECAGG, 3, 2)


# ------------------------------------------------------------------------- the accountant and the statement


def kls_rdp(order: float, release: DistributedRelease, fp: FixedPoint, scale: float, shares: int) -> float:
    """Kairouz, Liu, Steinke 2021's Proposition 14, evaluated here from its statement: ``n`` shares of parameter
    ``s^2`` each (the least entry's ``s_min^2``), sensitivities with the grid's rounding (``L2`` weighted to the
    noise-isotropic coordinates), ``tau`` summed term by term in ``mpmath``."""
    mpmath = pytest.importorskip("mpmath")
    grid = 4**fp.frac_bits
    total = release.variance * scale * grid  # n s^2 on the (diagonal) entries
    least = total * release.least
    s_min2 = mpmath.mpf(least) / shares
    tau = float(10 * mpmath.fsum(mpmath.exp(-2 * mpmath.pi**2 * s_min2 * k / (k + 1)) for k in range(1, shares)))
    m = release.entries
    scaled = release.sensitivity * 2**fp.frac_bits
    l2, l1 = scaled + release.isotropic, math.sqrt(m) * scaled + m
    return min(
        order * l2**2 / (2 * total) + tau * m,
        order / 2 * (l2**2 / total + 2 * tau * l1 / math.sqrt(least) + tau**2 * m),
        order / 2 * (l2 / math.sqrt(total) + tau * math.sqrt(m)) ** 2,
    )


@pytest.mark.parametrize("frac_bits", [15, 0], ids=["run's grid", "coarse: tau > 0"])
def test_the_accountants_epsilon_is_the_kls_bounds(frac_bits):
    """The accountant's ``epsilon`` equals ``dp_accounting``'s conversion of the summed independent evaluation, on
    the run's grid (``tau`` 0) and on a grid so coarse that the shares' ``sigma^2`` is about 1 (``tau`` above 0,
    which raises ``epsilon`` above the Gaussian's: the ``tau`` terms are in it)."""
    from dp_accounting.rdp.rdp_privacy_accountant import compute_epsilon

    fp = FixedPoint(frac_bits=frac_bits, bound=1.0)
    dp = DpSettings(epsilon=1.0, clip=0.3, mode="distributed") if frac_bits == 0 else DP
    releases = releases_of(dp, ("gram", "class_sum"), (D, D), WIDTH, 1.0)
    shares = 3
    independent = [sum(kls_rdp(a, r, fp, 1.0, shares) for r in releases.values()) for a in ORDERS]
    want = float(compute_epsilon(ORDERS, independent, dp.delta)[0])
    assert epsilon(releases, fp, dp.delta, shares=shares) == pytest.approx(want, rel=1e-9)
    gaussian = [sum(kls_rdp(a, r, fp, 1.0, 1) for r in releases.values()) for a in ORDERS]  # one share: tau = 0
    alone = float(compute_epsilon(ORDERS, gaussian, dp.delta)[0])
    if frac_bits == 0:
        least_share = min(r.variance * r.least for r in releases.values()) * 4**frac_bits / shares
        assert 0.3 < least_share < 3 and want > 1.005 * alone
    else:
        assert want == pytest.approx(alone, rel=1e-12)


def test_the_statement_has_no_samplers_term_and_states_tau():
    """``delta`` is the accountant's, exactly (the sampler is exact); ``log tau`` per statistic is far below
    float64's least exponent at the run's grid, and ``None`` where one honest share is all a sum holds."""
    noise = DistributedNoise(DP, SECAGG, 5, 3)
    releases = noise.layout_releases(ENTRIES)
    for survivors in (3, 4, 5):
        report = noise.report(releases, survivors)
        assert report["delta"] == DP.delta and "tv" not in report
        assert set(report["log_tau"]) == {"gram", "class_sum"}
        assert all(v < -1e9 for v in report["log_tau"].values())
    one = DistributedNoise(DpSettings(epsilon=1.0, clip=2.0, mode="distributed", colluders=1), SECAGG, 3, 2)
    report = one.report(one.layout_releases(ENTRIES), 2)
    assert report["log_tau"] == {"gram": None, "class_sum": None} and report["delta"] == DP.delta
    assert one.report(one.layout_releases(ENTRIES), 3)["log_tau"]["gram"] < -1e9  # two honest shares
