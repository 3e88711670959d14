"""Distributed noise for secure aggregation: the exact discrete Gaussian sampler (its building blocks' laws, its
law, no float in it, the CSPRNG and the seeded mode), shares whose survivors' sum carries the target variance, the
distributed discrete Gaussian's Renyi DP, the ring end to end, and the tails."""

from __future__ import annotations

import hashlib
import math
from fractions import Fraction

import numpy as np
import pytest

from common.secagg import discrete_gaussian as dg
from common.secagg.client_session import ClientSession
from common.secagg.discrete_gaussian import (
    KeyStream,
    bernoulli,
    bernoulli_exp,
    discrete_gaussian,
    discrete_laplace,
    split,
)
from common.secagg.noise import (
    add_noise,
    carried_variance,
    distributed_rdp,
    grid_sensitivity,
    grid_variance,
    log_tau,
    noise_share,
    noisy_fixed_point,
    share_grid_variance,
    share_variance,
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


def passes(stat: float, dof: int) -> bool:
    """Chi-square's mean is its dof, its sd sqrt(2 dof): six sd over is far beyond any fixed seed's chance."""
    return stat <= dof + 6 * math.sqrt(2 * dof)


def gaussian_pmf(variance: float) -> dict[int, float]:
    """``N_Z(0, variance)``'s pmf, normalised over ``|x| <= 40 sigma + 20`` (the rest below float64's reach)."""
    top = int(40 * math.sqrt(variance) + 20)
    weights = {x: math.exp(-(x * x) / (2 * variance)) for x in range(-top, top + 1)}
    total = math.fsum(weights.values())
    return {x: w / total for x, w in weights.items()}


def within(frequency: float, p: float, n: int) -> bool:
    """A frequency of ``n`` Bernoulli(``p``) draws within five standard errors of ``p``."""
    return abs(frequency - p) <= 5 * math.sqrt(p * (1 - p) / n) + 1e-12


# ------------------------------------------------------------------------- the sampler's building blocks


@pytest.mark.parametrize(
    "gamma",
    [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(5, 2), Fraction(17, 7), Fraction(10**400 + 7, 10**400)],
    ids=["0", "1/3", "1", "5/2", "17/7", "1+7e-400"],
)
def test_bernoulli_exp_succeeds_with_probability_exp_minus_gamma(gamma):
    """Algorithm 1 at ``gamma`` below, at and above 1 (the integer part's ``exp(-1)`` draws): the frequency is
    ``exp(-gamma)`` within five standard errors, and not ``exp(-1.1 gamma)`` (the test can tell). The last
    ``gamma``'s numerator and denominator overflow a float: they are used as integers."""
    n = 100_000
    p = math.exp(-float(gamma))
    frequency = float(bernoulli_exp(gamma, n, seed=seed(f"bexp {gamma}")).mean())
    assert within(frequency, p, n), (frequency, p)
    assert gamma == 0 or not within(frequency, math.exp(-1.1 * float(gamma)), n)


def test_a_rational_bernoulli_reads_p_exactly():
    """``bernoulli(p)``: 1/3 at its frequency; ``p = 0`` never and ``p = 1`` always (words are below ``2^64``)."""
    stream = KeyStream(seed=seed("bernoulli"))
    n = 20_000
    assert within(sum(bernoulli(Fraction(1, 3), stream) for _ in range(n)) / n, 1 / 3, n)
    assert not any(bernoulli(Fraction(0), stream) for _ in range(100))
    assert all(bernoulli(Fraction(1), stream) for _ in range(100))


def test_the_discrete_laplace_has_its_law():
    """Algorithm 2 at scale ``t = 3``: ``P(x) = (1 - e^(-1/t)) / (1 + e^(-1/t)) e^(-|x|/t)``, chi-square; the law
    at ``t = 4`` fails."""
    samples = discrete_laplace(3, 100_000, KeyStream(seed=seed("laplace")))

    def pmf(t: int) -> dict[int, float]:
        q = math.exp(-1 / t)
        return {x: (1 - q) / (1 + q) * q ** abs(x) for x in range(-60 * t, 60 * t + 1)}

    assert passes(*chi_square(samples, pmf(3)))
    assert not passes(*chi_square(samples, pmf(4)))


def test_no_float_enters_the_sampler():
    """``split`` is exact where a float rounds: ``1 + 2^-64`` is ``1.0`` in float64, whose fraction's first 64
    bits would be 0, not 1; the acceptance exponent at a grid variance of ``2^38`` (numerator ~``2^80``) splits
    exactly; a float parameter is refused by name; an ``int`` and the equal ``Fraction`` give the same draws."""
    assert float(Fraction(2**64 + 1, 2**64)) == 1.0
    assert split(Fraction(2**64 + 1, 2**64)) == (1, 1)
    assert split(Fraction(2**64 - 1, 2**64)) == (0, 2**64 - 1)
    a = 2**38
    t = math.isqrt(a) + 1
    z = 3 * a * t - a  # |Y| = 3 a: the numerator (|Y| t - a)^2 ~ 2^80
    whole, bits = split(Fraction(z * z, 2 * a * t * t))
    assert whole == (z * z) // (2 * a * t * t) and bits == (((z * z) % (2 * a * t * t)) << 64) // (2 * a * t * t)
    assert z * z > 2**80
    for refused in (2.5, np.float64(7.0), True):
        with pytest.raises(SecAggError, match="as an int or a Fraction"):
            discrete_gaussian(refused, 10, seed=seed("float"))
    with pytest.raises(SecAggError, match="as an int or a Fraction"):
        bernoulli_exp(0.5, 10, seed=seed("float"))
    with pytest.raises(SecAggError, match=">= 0"):
        bernoulli_exp(Fraction(-1, 2), 10, seed=seed("float"))
    assert np.array_equal(
        discrete_gaussian(7, 500, seed=seed("i")), discrete_gaussian(Fraction(7), 500, seed=seed("i"))
    )


# ------------------------------------------------------------------------- the discrete Gaussian's law


@pytest.mark.parametrize("variance", [Fraction(1), Fraction(5, 2), Fraction(7)], ids=["1", "5/2", "7"])
def test_the_sampler_follows_the_discrete_gaussian_law(variance):
    """Chi-square of 100,000 draws against ``N_Z(0, sigma^2)``'s exact pmf (normalised numerically): passes, and
    fails against the law of 0.85 or 1.15 times the variance (the test can tell)."""
    samples = discrete_gaussian(variance, 100_000, seed=seed(f"law {variance}"))
    stat, dof = chi_square(samples, gaussian_pmf(float(variance)))
    assert passes(stat, dof), (stat, dof)
    for wrong in (0.85, 1.15):
        assert not passes(*chi_square(samples, gaussian_pmf(wrong * float(variance))))


def test_at_a_shares_grid_variance_the_mean_is_zero_and_the_variance_sigma_squared():
    """``sigma^2 = 2^38``: 100,000 draws' variance within 2.5% of it (five standard errors ``sqrt(2 / m)`` are 2.2%;
    half or twice it fails by far) and their mean within five standard errors of 0."""
    m, variance = 100_000, 2**38
    x = discrete_gaussian(variance, m, seed=seed("grid")).astype(np.float64)
    assert abs(x.var() / variance - 1) <= 0.025
    assert abs(x.mean()) <= 5 * math.sqrt(variance / m)


def test_four_shares_sum_to_the_discrete_gaussian_of_the_summed_variance():
    """Shares of ``N_Z(0, 25)`` are not closed under sums, but four of them are within ``tau ~ e^-240`` of
    ``N_Z(0, 100)`` (Kairouz, Liu, Steinke 2021): a chi-square test sees the latter, and not 0.85 or 1.15 of it."""
    total = sum(discrete_gaussian(25, 50_000, seed=seed(f"share {i}")) for i in range(4))
    assert passes(*chi_square(total, gaussian_pmf(100.0)))
    for wrong in (85.0, 115.0):
        assert not passes(*chi_square(total, gaussian_pmf(wrong)))


# ------------------------------------------------------------------------- the generator


def test_the_seeded_mode_is_deterministic_and_seeds_differ():
    a = discrete_gaussian(2**30, 1000, seed=seed("a"))
    assert np.array_equal(a, discrete_gaussian(2**30, 1000, seed=seed("a")))
    assert not np.array_equal(a, discrete_gaussian(2**30, 1000, seed=seed("b")))
    with pytest.raises(SecAggError, match="32-byte seed"):
        discrete_gaussian(1, 10, seed=b"short")
    with pytest.raises(SecAggError, match="at most 2\\^60"):
        discrete_gaussian(2**60 + 1, 1)


def test_the_default_mode_draws_from_the_csprng_and_never_from_numpys_generators(monkeypatch):
    """Unseeded calls differ; each takes a fresh key from ``secrets``; numpy's global state stays as it was and
    its generators are never constructed (they are not cryptographic)."""
    keys: list[bytes] = []
    token_bytes = dg.secrets.token_bytes

    def recorded(n: int) -> bytes:
        keys.append(token_bytes(n))
        return keys[-1]

    def forbidden(*args: object, **kwargs: object) -> None:
        raise AssertionError("numpy's generator was used")

    monkeypatch.setattr(dg.secrets, "token_bytes", recorded)
    for name in ("default_rng", "Generator", "RandomState", "normal", "random", "seed"):
        monkeypatch.setattr(np.random, name, forbidden)
    np.random.set_state(("MT19937", np.arange(624, dtype=np.uint32), 0, 0, 0.0))
    before = np.random.get_state()
    first, second = discrete_gaussian(2**30, 5000), discrete_gaussian(2**30, 5000)
    assert not np.array_equal(first, second)
    assert len(keys) == 2 and keys[0] != keys[1] and all(len(k) == 32 for k in keys)
    after = np.random.get_state()
    assert all(np.array_equal(x, y) for x, y in zip(before, after))


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
    share = share_grid_variance(1e6, FixedPoint(frac_bits=0, bound=1.0), n, t, colluders=c)
    assert share == 500_000
    shares = [discrete_gaussian(share, m, seed=seed(f"colluder {i}")) for i in range(n)]
    honest = (shares[1] + shares[2]).astype(np.float64)  # survivors 0, 1, 2; client 0 colludes
    assert abs(honest.var() / 1e6 - 1) <= 0.06
    with pytest.raises(SecAggError, match="fewer colluders than the threshold 3"):
        share_variance(1.0, n, t, colluders=3)


def test_a_shares_grid_variance_is_the_real_one_rounded_up_exactly():
    """``ceil(sigma^2 4^f / (t - c))`` of the float ``sigma^2`` as the rational it is: an integer, at least the real
    share's, below it plus one; ``0.1`` (not a binary fraction) rounds up where its float product is an integer."""
    fp = FixedPoint(frac_bits=10, bound=1.0)
    for variance, t, c in ((0.1, 3, 0), (0.25, 4, 1), (1e-3, 2, 0), (3.0, 3, 0)):
        grid = share_grid_variance(variance, fp, 5, t, colluders=c)
        exact = Fraction(variance) * 4**fp.frac_bits / (t - c)
        assert isinstance(grid, int) and exact <= grid < exact + 1
    assert share_grid_variance(3.0, fp, 5, 3) == 4**10  # exact: no rounding up of an integer
    assert share_grid_variance(0.1, FixedPoint(frac_bits=0, bound=1.0), 5, 1) == 1  # 0.1000000000000000055...
    with pytest.raises(SecAggError, match="exceeds the sampler's 2\\^60"):
        share_grid_variance(1.0, FixedPoint(frac_bits=31, bound=1.0), 5, 1)


# ------------------------------------------------------------------------- the ring, end to end


def _ring_ints(ring: np.ndarray) -> list[int]:
    """Ring elements as Python integers in ``[-2^127, 2^127)``."""
    values = [int(lo) + (int(hi) << 64) for lo, hi in ring]
    return [v - 2**128 if v >= 2**127 else v for v in values]


def test_noisy_inputs_through_the_secagg_rounds_with_a_dropped_client_sum_exactly():
    """Five clients, threshold 3, client 2 drops after sharing its keys: the unmasked sum equals, in grid
    units and exactly, the survivors' rounded values plus the survivors' noise shares."""
    from common.secagg.client_session import ClientSession
    from common.secagg.server_session import ServerSession

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


def test_the_tail_bound_holds_and_is_the_sub_gaussian_quantile():
    """No entry of ``m`` draws exceeds the bound at ``failure = 1e-3``; the bound is the sub-Gaussian quantile
    ``sqrt(2 V log(2m / failure))`` rounded up, and at ``failure = 0.5`` the largest of the draws comes near it
    (within 20%: the bound is not loose)."""
    variance, m = 2**36, 100_000
    draws = discrete_gaussian(variance, m, seed=seed("tail"))
    bound = tail_bound(variance, m, failure=1e-3)
    assert int(np.abs(draws).max()) <= bound == math.ceil(math.sqrt(2 * variance * math.log(2 * m / 1e-3)))
    assert int(np.abs(draws).max()) >= 0.8 * tail_bound(variance, m, failure=0.5)
    assert tail_bound(0.0, m) == 0


def test_the_widened_fixed_point_keeps_check_and_decode_with_the_noises_tail():
    """Values at the bound plus noise decode beyond ``n x bound``: the plain encoding refuses the noisy sum as an
    overflow, the widened one (bound + one share's tail) accepts it; a share beyond its tail is refused."""
    n, count = 3, 1000
    fp = FixedPoint(frac_bits=10, bound=1e-3)  # bound x 2^f ~ 1 grid unit: the noise dominates
    share_grid = 400
    tail = tail_bound(share_grid, count)
    wide = noisy_fixed_point(fp, tail)
    wide.check(n)
    from common.secagg.primitives import ring_add, ring_zeros

    total = ring_zeros(count)
    for i in range(n):
        e = discrete_gaussian(share_grid, count, seed=seed(f"wide {i}"))
        total = ring_add(total, add_noise(encode(np.full(count, fp.bound), fp), e, tail))
    with pytest.raises(SecAggError, match="beyond"):
        decode(total, fp, n)
    assert np.isfinite(decode(total, wide, n)).all()
    with pytest.raises(SecAggError, match="exceeds its tail bound"):
        add_noise(encode(np.zeros(2), fp), np.array([0, tail + 1]), tail)


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


def test_log_tau_is_the_kls_sum_in_log_space():
    """``tau = 10 sum_{k=1}^{n-1} exp(-2 pi^2 sigma^2 k / (k + 1))``: against the direct sum where it does not
    underflow; at a share's grid variance its log is finite and about ``-pi^2 sigma^2`` (the first term), where
    the direct sum is 0; one share has none (``-inf``); ``sigma < 1/2`` is refused (the theorem's condition)."""
    for share, n in ((0.3, 2), (0.3, 5), (1.0, 7), (4.0, 3)):
        direct = 10 * sum(math.exp(-2 * math.pi**2 * share * k / (k + 1)) for k in range(1, n))
        assert math.exp(log_tau(share, n)) == pytest.approx(direct, rel=1e-12)
    big = 2.0**37
    assert log_tau(big, 3) == pytest.approx(math.log(10) - math.pi**2 * big, rel=1e-12)
    assert 10 * sum(math.exp(-2 * math.pi**2 * big * k / (k + 1)) for k in range(1, 3)) == 0.0
    assert log_tau(big, 1) == -math.inf
    with pytest.raises(SecAggError, match="sigma >= 1/2"):
        log_tau(0.2, 3)
    assert log_tau(0.2, 1) == -math.inf  # one share is the discrete Gaussian itself, at any sigma


def test_the_distributed_rdp_is_the_gaussians_with_one_share_and_pays_tau_with_several():
    """One share: ``alpha L2^2 / (2 V)`` exactly (the discrete Gaussian's, CKS 2020). Shares of a small
    ``sigma^2`` (``tau`` about 0.5): the least of Proposition 14's three forms, computed here from them, and above
    the Gaussian's; at a share's grid variance ``tau`` vanishes."""
    l1, l2, m = 12.0, 3.0, 16
    for order in (1.5, 2, 10):
        assert distributed_rdp(order, l1, l2, 50.0, 1, m) == pytest.approx(order * l2**2 / 100, rel=1e-15)
    v, least, n = 2.0, 1.0, 3
    tau = math.exp(log_tau(least / n, n))
    assert 0.3 < tau < 0.6
    for order in (1.5, 2, 10):
        forms = (
            order * l2**2 / (2 * v) + tau * m,
            order / 2 * (l2**2 / v + 2 * tau * l1 / math.sqrt(least) + tau**2 * m),
            order / 2 * (l2 / math.sqrt(v) + tau * math.sqrt(m)) ** 2,
        )
        got = distributed_rdp(order, l1, l2, v, n, m, least=least)
        assert got == pytest.approx(min(forms), rel=1e-12) and got > order * l2**2 / (2 * v)
    assert distributed_rdp(2, l1, l2, 2.0**40, 3, m) == pytest.approx(2 * l2**2 / 2.0**41, rel=1e-15)
    with pytest.raises(SecAggError, match="order >= 1"):
        distributed_rdp(0.5, l1, l2, v, n, m)


def test_no_survivor_set_a_client_answers_carries_less_than_the_target():
    """The coordinator picks the survivors (M3), and it may collude with up to ``k`` clients: for every ``n``, ``t``
    and ``k < t``, every survivor set a client answers (``t`` or more, itself among them; a request naming fewer is
    refused by the client itself) carries at least ``sigma^2`` against the coordinator and the colluders, whoever
    is in it; the least, exactly ``sigma^2``, at ``t`` survivors with every colluder among them."""
    for n in range(2, 13):
        for t in range(1, n + 1):
            for k in range(t):
                carried = [carried_variance(1.0, n, t, s, colluders=k) for s in range(t, n + 1)]
                assert min(carried) == pytest.approx(1.0) and carried == sorted(carried)
    session = ClientSession(0, 3, CONTEXT)
    session.sharers = [0, 1, 2, 3, 4]
    with pytest.raises(SecAggError, match="2 survivors, fewer than the threshold 3"):
        session.reveal({}, [0, 1], [2, 3, 4])
