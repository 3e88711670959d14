"""Distributed noise for secure aggregation (issue 44 part 2): Skellam shares whose survivors' sum carries
the target variance, their law, the CSPRNG and the seeded mode, the ring end to end, and the tails."""

from __future__ import annotations

import hashlib
import math

import numpy as np
import pytest

from common.secagg import noise
from common.secagg.noise import (
    add_noise,
    carried_variance,
    grid_sensitivity,
    grid_variance,
    noise_share,
    noisy_fixed_point,
    poisson,
    share_variance,
    skellam,
    skellam_rdp,
    tail_bound,
    to_ring,
)
from common.secagg.primitives import FixedPoint, SecAggError, decode, encode

CONTEXT = b"run|task 0|round 1|gram"


def seed(name: str) -> bytes:
    return hashlib.sha256(name.encode()).digest()


def chi_square(samples: np.ndarray, pmf: dict[int, float]) -> tuple[float, int]:
    """Pearson's statistic of integer ``samples`` against ``pmf`` (values with expected count < 5 pooled into
    one cell, the rest of the mass too) and its degrees of freedom."""
    n = len(samples)
    values, counts = np.unique(samples, return_counts=True)
    observed = dict(zip(values.tolist(), counts.tolist()))
    cells = [k for k, p in pmf.items() if n * p >= 5]
    rest_expected = n * (1 - sum(pmf[k] for k in cells))
    rest_observed = n - sum(observed.get(k, 0) for k in cells)
    stat = sum((observed.get(k, 0) - n * pmf[k]) ** 2 / (n * pmf[k]) for k in cells)
    if rest_expected > 0:
        stat += (rest_observed - rest_expected) ** 2 / rest_expected
    return stat, len(cells)


def poisson_pmf(mean: float, top: int) -> np.ndarray:
    return np.array([math.exp(-mean + k * math.log(mean) - math.lgamma(k + 1)) for k in range(top)])


def skellam_pmf(variance: float) -> dict[int, float]:
    """``Sk(v/2, v/2)``'s pmf by convolving two Poisson pmfs (exact to float64 on the support kept)."""
    top = int(variance / 2 + 40 * math.sqrt(variance / 2) + 60)
    p = poisson_pmf(variance / 2, top)
    conv = np.convolve(p, p[::-1])  # index i: P - P' = i - (top - 1)
    return {i - (top - 1): float(q) for i, q in enumerate(conv)}


def passes(stat: float, dof: int) -> bool:
    """Chi-square's mean is its dof, its sd sqrt(2 dof): six sd over is far beyond any fixed seed's chance."""
    return stat <= dof + 6 * math.sqrt(2 * dof)


# ------------------------------------------------------------------------- the target variance


def test_the_survivors_shares_sum_to_the_target_variance_and_mean_zero():
    """Any ``t`` of ``n`` clients carry ``sigma^2``; all ``n`` carry ``n / t`` of it. Shares of ``sigma^2 / n`` (the
    naive split) or off by a factor of 2 fall outside the bound: the estimate's sd is ``sqrt(2 / m)`` = 1%."""
    n, t, m = 5, 3, 20_000
    fp = FixedPoint(frac_bits=12, bound=10.0)
    variance = 0.25  # real units; 0.25 x 4^12 grid units
    shares = {i: noise_share(m, variance, fp, n, t, seed=seed(f"client {i}")) for i in range(n)}
    target = grid_variance(variance, fp)
    for survivors in ([0, 2, 4], [1, 2, 3, 4], list(range(n))):
        total = sum(shares[i] for i in survivors)
        ratio = float(total.astype(np.float64).var()) / target
        assert abs(ratio - len(survivors) / t) <= 0.06
        assert abs(float(total.mean())) <= 6 * math.sqrt(len(survivors) * target / t / m)
        assert carried_variance(variance, n, t, len(survivors)) == pytest.approx(len(survivors) * variance / t)
    three = sum(shares[i] for i in (0, 2, 4)).astype(np.float64).var() / target
    assert abs(three - 1) <= 0.06 and abs(3 / n * three - 1) > 0.06  # sigma^2 / n shares would fail
    assert abs(2 * three - 1) > 0.06 and abs(three / 2 - 1) > 0.06  # so would a factor of 2 either way


def test_share_and_carried_variance_refuse_what_a_step_cannot_have():
    assert share_variance(6.0, 5, 3) == 2.0
    assert carried_variance(6.0, 5, 3, 3) == 6.0 and carried_variance(6.0, 5, 3, 5) == 10.0
    with pytest.raises(SecAggError, match="threshold in \\[1, 5\\]"):
        share_variance(1.0, 5, 6)
    with pytest.raises(SecAggError, match="as survivors, got 2"):
        carried_variance(1.0, 5, 3, 2)
    with pytest.raises(SecAggError, match="finite variance"):
        share_variance(float("nan"), 5, 3)


def test_colluding_clients_cannot_take_the_sum_below_the_target():
    """``c`` colluders subtract their own shares: shares of ``sigma^2 / (t - c)`` leave ``sigma^2`` in any ``t``
    survivors' sum, measured on the shares themselves (the colluders' taken out)."""
    n, t, c, m = 5, 3, 1, 20_000
    assert share_variance(6.0, n, t, colluders=c) == 3.0
    assert carried_variance(6.0, n, t, 3, colluders=c) == 6.0 and carried_variance(6.0, n, t, 5, colluders=c) == 12.0
    shares = [skellam(share_variance(1e6, n, t, colluders=c), m, seed=seed(f"colluder {i}")) for i in range(n)]
    honest = (shares[1] + shares[2]).astype(np.float64)  # survivors 0, 1, 2; client 0 colludes
    assert abs(honest.var() / 1e6 - 1) <= 0.06
    with pytest.raises(SecAggError, match="fewer colluders than the threshold 3"):
        share_variance(1.0, n, t, colluders=3)


# ------------------------------------------------------------------------- the law


@pytest.mark.parametrize("variance", [0.4, 3.0, 30.0])
def test_the_sum_of_shares_is_exactly_skellam_of_the_summed_variance(variance):
    """Four shares of ``v / 4`` sum to ``Sk(v/2, v/2)`` (Poissons add): the sum passes a chi-square test against
    that law, and fails it against the law of half or twice the variance (the test can tell)."""
    m = 40_000
    total = sum(skellam(variance / 4, m, seed=seed(f"share {i}")) for i in range(4))
    stat, dof = chi_square(total, skellam_pmf(variance))
    assert passes(stat, dof), (stat, dof)
    for wrong in (variance / 2, 2 * variance):
        assert not passes(*chi_square(total, skellam_pmf(wrong)))


@pytest.mark.parametrize("mean", [0.7, 9.5, 10.0, 57.3, 1e4])
def test_poisson_variates_follow_the_poisson_law_on_both_samplers(mean):
    """Inversion below a mean of 10, PTRS from 10: chi-square against the pmf from ``lgamma``, and the first two
    moments within five standard errors (a pmf off by 20% in PTRS's test region fails; one off by 5% does not)."""
    m = 200_000
    samples = poisson(mean, m, seed=seed(f"poisson {mean}"))
    top = int(mean + 40 * math.sqrt(mean) + 60)
    pmf = dict(enumerate(poisson_pmf(mean, top).tolist()))
    stat, dof = chi_square(samples, pmf)
    assert passes(stat, dof), (stat, dof)
    x = samples.astype(np.float64)
    assert abs(x.mean() - mean) <= 5 * math.sqrt(mean / m)
    assert abs(x.var() / mean - 1) <= 5 * math.sqrt((2 + 1 / mean) / m)


def test_poisson_with_the_largest_mean_matches_its_normal_limit_per_bin():
    """``mean = 2^40``: the skewness is ``1e-6``, so the normal's bins are the law's to that precision; 40
    equiprobable-ish bins of the standardized variates pass a chi-square test, and the first two moments match."""
    mean, m = 2.0**40, 100_000
    z = (poisson(mean, m, seed=seed("large")).astype(np.float64) - mean) / math.sqrt(mean)
    edges = np.linspace(-3, 3, 41)
    cdf = np.array([0.5 * (1 + math.erf(e / math.sqrt(2))) for e in edges])
    expected = np.diff(np.concatenate([[0.0], cdf, [1.0]])) * m
    observed = np.bincount(np.searchsorted(edges, z), minlength=len(expected))
    stat = float(((observed - expected) ** 2 / expected).sum())
    assert passes(stat, len(expected) - 1), stat
    assert abs(z.mean()) < 6 / math.sqrt(m) and abs(z.var() - 1) < 6 * math.sqrt(2 / m)


@pytest.mark.parametrize("mean", [10.0, 1234.5, 2.0**30 + 0.3, 2.0**40, 2.0**50])
def test_the_log_pmf_is_free_of_cancellation(mean):
    """PTRS's accept test reads the log-pmf: Stirling's form is within ``1e-12 + 4 eps' |k - mean|`` of 60-digit
    arithmetic from 12 sd below to 12 sd above the mean (``5e-8`` at ``2^50``); the textbook float64 formula is
    off by ``~eps mean log mean`` (it fails the bound from ``2^30`` on)."""
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 60
    k = np.unique(np.floor(mean + np.linspace(-12, 12, 49) * math.sqrt(mean)).clip(0))
    exact = np.array([float(-mpmath.mpf(mean) + int(v) * mpmath.log(mean) - mpmath.loggamma(int(v) + 1)) for v in k])
    bound = 1e-12 + 4e-16 * np.abs(k - mean)
    assert (np.abs(noise._log_pmf(k, mean) - exact) <= bound).all()
    textbook = np.array([-mean + v * math.log(mean) - math.lgamma(v + 1) for v in k])
    assert mean < 2.0**30 or (np.abs(textbook - exact) > bound).any()


# ------------------------------------------------------------------------- the generator


def test_the_seeded_mode_is_deterministic_and_seeds_differ():
    a = skellam(1e6, 1000, seed=seed("a"))
    assert np.array_equal(a, skellam(1e6, 1000, seed=seed("a")))
    assert not np.array_equal(a, skellam(1e6, 1000, seed=seed("b")))
    with pytest.raises(SecAggError, match="32-byte seed"):
        skellam(1.0, 10, seed=b"short")


def test_the_default_mode_draws_from_the_csprng_and_never_from_numpys_generators(monkeypatch):
    """Unseeded calls differ; each takes a fresh key from ``secrets``; numpy's global state stays as it was and
    its generators are never constructed (they are not cryptographic)."""
    keys: list[bytes] = []
    token_bytes = noise.secrets.token_bytes

    def recorded(n: int) -> bytes:
        keys.append(token_bytes(n))
        return keys[-1]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("numpy's generator was used")

    monkeypatch.setattr(noise.secrets, "token_bytes", recorded)
    for name in ("default_rng", "Generator", "RandomState", "poisson", "random", "seed"):
        monkeypatch.setattr(np.random, name, forbidden)
    np.random.set_state(("MT19937", np.arange(624, dtype=np.uint32), 0, 0, 0.0))
    before = np.random.get_state()
    first, second = skellam(2.0**30, 5000), skellam(2.0**30, 5000)
    assert not np.array_equal(first, second)
    assert len(keys) == 2 and keys[0] != keys[1] and all(len(k) == 32 for k in keys)
    after = np.random.get_state()
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


# ------------------------------------------------------------------------- the ring, end to end


def _ring_ints(ring: np.ndarray) -> list[int]:
    """Ring elements as Python integers in ``[-2^127, 2^127)``."""
    values = [int(lo) + (int(hi) << 64) for lo, hi in ring]
    return [v - 2**128 if v >= 2**127 else v for v in values]


def test_noisy_inputs_through_the_secagg_rounds_with_a_dropped_client_sum_exactly():
    """Five clients, threshold 3, client 2 drops after sharing its keys: the unmasked sum equals, in grid
    units and exactly, the survivors' rounded values plus the survivors' noise shares."""
    from common.secagg.rounds import ClientSession, ServerSession

    n, t, count = 5, 3, 257
    fp = FixedPoint(frac_bits=20, bound=8.0)
    variance = 0.01  # real units: a noise sd of 0.1 on the sum
    share_grid = grid_variance(share_variance(variance, n, t), fp)
    tail = tail_bound(share_grid, count)
    wide = noisy_fixed_point(fp, tail)
    wide.check(n)
    values = {i: np.linspace(-8, 8, count) * math.cos(i + 1) for i in range(n)}  # bounded by 8
    shares = {i: noise_share(count, variance, fp, n, t, seed=seed(f"e2e {i}")) for i in range(n)}

    clients = {i: ClientSession(i, t, CONTEXT) for i in range(n)}
    server = ServerSession(expected=list(range(n)), threshold=t, context=CONTEXT, size=count)
    for c in clients.values():
        server.advertise(c.advertise())
    roster = server.close_keys()
    for i, c in clients.items():
        server.share(i, c.share(roster))
    sharers = server.close_shares()
    for i in (0, 1, 3, 4):  # client 2 drops before sending its masked input
        server.masked_input(i, clients[i].mask(add_noise(encode(values[i], fp), shares[i], tail), sharers))
    survivors, dropped = server.close_inputs()
    assert (survivors, dropped) == ([0, 1, 3, 4], [2])
    for i in survivors:
        server.reveal(i, clients[i].reveal(server.inbox(i), survivors, dropped))
    total = server.result()

    scale = 2**fp.frac_bits
    clean = [sum(int(np.rint(values[i][j] * scale)) for i in survivors) for j in range(count)]
    want = [c + sum(int(shares[i][j]) for i in survivors) for j, c in enumerate(clean)]
    assert _ring_ints(total) == want
    decoded = decode(total, wide, len(survivors))
    assert np.array_equal(decoded * scale, np.array(want, dtype=np.float64))
    assert np.abs(decoded * scale - np.array(clean, dtype=np.float64)).max() > 0  # the noise is there


def test_to_ring_is_twos_complement():
    e = np.array([0, 1, -1, 2**52, -(2**52)], dtype=np.int64)
    assert _ring_ints(to_ring(e)) == e.tolist()


# ------------------------------------------------------------------------- tails and overflow


def test_the_tail_bound_holds_and_is_not_loose():
    """No entry of ``m`` draws exceeds the bound at ``failure = 1e-3``; the bound is within 15% of the normal's
    quantile ``sqrt(2 V log(2m / failure))`` at a large variance (Skellam is near normal there)."""
    variance, m = 2.0**36, 100_000
    draws = skellam(variance, m, seed=seed("tail"))
    bound = tail_bound(variance, m, failure=1e-3)
    assert int(np.abs(draws).max()) <= bound
    normal = math.sqrt(2 * variance * math.log(2 * m / 1e-3))
    assert normal <= bound <= 1.15 * normal
    assert tail_bound(0.0, m) == 0
    small = tail_bound(0.5, 10**6, failure=2.0**-64)  # a small variance: Poisson-like, heavier than normal
    assert small > math.sqrt(2 * 0.5 * math.log(2 * 10**6 * 2.0**64))


def test_the_widened_fixed_point_keeps_check_and_decode_with_the_noises_tail():
    """Values at the bound plus noise decode beyond ``n x bound``: the plain encoding refuses the noisy sum as an
    overflow, the widened one (bound + one share's tail) accepts it; a share beyond its tail is refused."""
    n, count = 3, 1000
    fp = FixedPoint(frac_bits=10, bound=1e-3)  # bound x 2^f ~ 1 grid unit: the noise dominates
    share_grid = 400.0
    tail = tail_bound(share_grid, count)
    wide = noisy_fixed_point(fp, tail)
    wide.check(n)
    from common.secagg.primitives import ring_add, ring_zeros

    total = ring_zeros(count)
    for i in range(n):
        e = skellam(share_grid, count, seed=seed(f"wide {i}"))
        total = ring_add(total, add_noise(encode(np.full(count, fp.bound), fp), e, tail))
    with pytest.raises(SecAggError, match="beyond"):
        decode(total, fp, n)
    assert np.isfinite(decode(total, wide, n)).all()
    with pytest.raises(SecAggError, match="exceeds its tail bound"):
        add_noise(encode(np.zeros(2), fp), np.array([0, tail + 1]), tail)
    with pytest.raises(SecAggError, match="2\\^41\\] grid units, got .*: lower frac_bits by at least 1"):
        skellam(2.0**42, 1)


# ------------------------------------------------------------------------- sensitivity and Renyi DP


def test_the_grid_sensitivity_bounds_the_rounded_change_and_needs_its_rounding_term():
    """Entries just below a half step on one side, just above on the other: a tiny real change moves every
    changed entry by a whole grid step. The bound ``l2 2^f + sqrt(m)`` holds; ``l2 2^f`` alone would not."""
    fp = FixedPoint(frac_bits=8, bound=1e3)
    m = 64
    step = 2.0**-fp.frac_bits
    a = (np.arange(m) + 0.4999) * step
    b = a + 0.0002 * step
    diff = np.rint(b / step) - np.rint(a / step)
    l2_real = float(np.linalg.norm(b - a))
    l2, l1 = grid_sensitivity(l2_real, m, fp)
    assert np.linalg.norm(diff) <= l2 and np.abs(diff).sum() <= l1
    assert np.linalg.norm(diff) > l2_real * 2**fp.frac_bits
    rng = np.random.default_rng(0)  # test data only
    for _ in range(200):
        x = rng.uniform(-5, 5, m)
        y = x + rng.normal(size=m) * 10.0 ** rng.integers(-4, 1)
        d = np.rint(y * 2**fp.frac_bits) - np.rint(x * 2**fp.frac_bits)
        l2, l1 = grid_sensitivity(float(np.linalg.norm(y - x)), m, fp)
        assert np.linalg.norm(d) <= l2 and np.abs(d).sum() <= l1 + 1e-9


def test_skellam_rdp_tends_to_the_gaussian_mechanisms():
    """At a variance large against the sensitivities the lattice's terms vanish: ``alpha l2^2 / (2 V)``; at a
    small one they dominate; the published form at one point; non-integer orders are refused."""
    l2, l1 = 1000.0, 30_000.0
    for order in (2, 8, 32):
        gaussian = order * l2**2 / (2 * 1e12)
        assert gaussian <= skellam_rdp(order, l1, l2, 1e12) <= gaussian * (1 + 1e-6)
        assert skellam_rdp(order, l1, l2, 1e6) > order * l2**2 / (2 * 1e6)
    # 2 alpha in the lattice term: the larger of the corollary's readings
    assert skellam_rdp(3, 2.0, 1.0, 4.0) == pytest.approx(3 / 8 + min((6 + 12) / 64, 6 / 8))
    with pytest.raises(SecAggError, match="integer order > 1"):
        skellam_rdp(1, l1, l2, 1.0)
    with pytest.raises(SecAggError, match="integer order > 1"):
        skellam_rdp(2.5, l1, l2, 1.0)


def test_the_samplers_total_variation_bound_per_entry():
    """A Skellam entry's bound is its two Poissons'; PTRS's grows as ``sqrt(mean)`` (its grid terms) and stays
    below ``4e-9`` per variate at the cap, about ``1e-9`` a Poisson at a distributed-DP share's grid (``2^37``)."""
    assert noise.poisson_tv(0.0) == 0.0 and noise.skellam_tv(0.0) == 0.0
    assert noise.skellam_tv(2.0**38) == 2 * noise.poisson_tv(2.0**37)
    assert 1e-9 < noise.poisson_tv(2.0**37) < 2e-9 and noise.poisson_tv(noise.MAX_MEAN) < 4e-9
    assert noise.poisson_tv(4e4) / noise.poisson_tv(1e4) == pytest.approx(2, rel=1e-3)
    assert noise.poisson_tv(5.0) < 1e-10  # inversion: its cells' rounding only
    with pytest.raises(SecAggError, match="Poisson mean"):
        noise.poisson_tv(2 * noise.MAX_MEAN)
