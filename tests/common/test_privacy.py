"""Differential privacy of the closed-form heads' statistics (common/privacy/): the calibration against the
Gaussian mechanism's own privacy curve, the noise's scale, the sensitivity that clipping bounds, the ledger."""

import math

import pytest
import torch
from dp_accounting.pld import pld_privacy_accountant
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy.stats import norm

from client.features import feature_map, sums
from common.methods import describe
from common.methods.checks import validate
from common.privacy.gaussian import (
    CLASS_SUM,
    GRAM,
    Release,
    SecureNoise,
    SeededNoise,
    add_noise,
    calibrate,
    composed_event,
    composed_mu,
    gaussian_mu,
    noise_source,
)
from common.privacy.ledger import BudgetExceeded, PrivacyLedger
from common.run.config import RunConfig
from common.run.settings import DpSettings

STATISTICS = (GRAM, CLASS_SUM, "class_count")


def gaussian_delta(mu: float, epsilon: float) -> float:
    """The Gaussian mechanism's exact privacy curve (Balle and Wang 2018, theorem 8), written out here and not
    taken from the library under test: ``delta(eps) = Phi(-eps / mu + mu / 2) - e^eps Phi(-eps / mu - mu / 2)``."""
    return float(norm.cdf(-epsilon / mu + mu / 2) - math.exp(epsilon) * norm.cdf(-epsilon / mu - mu / 2))


@pytest.mark.parametrize("epsilon, delta", [(0.5, 1e-5), (1.0, 1e-5), (4.0, 1e-6), (8.0, 1e-5)])
def test_one_release_is_exactly_epsilon_delta(epsilon, delta):
    mu = gaussian_mu(epsilon, delta)
    assert gaussian_delta(mu, epsilon) == pytest.approx(delta, rel=1e-6)
    assert gaussian_delta(mu * 1.01, epsilon) > delta * 1.01  # a smaller noise would not do


def test_mu_of_epsilon_one_is_the_known_figure():
    assert gaussian_mu(1.0, 1e-5) == pytest.approx(0.268, abs=5e-4)


@pytest.mark.parametrize("clip", [0.5, 1.0, 33.9])
@pytest.mark.parametrize("share", [0.05, 0.5])
@pytest.mark.parametrize("epsilon", [1.0, 2.0])
def test_the_noise_scale_is_the_calibration_of_epsilon_delta_and_the_sensitivity(clip, share, epsilon):
    dp = DpSettings(epsilon=epsilon, delta=1e-5, clip=clip, gram_share=share)
    releases = calibrate(dp, STATISTICS)
    assert set(releases) == {GRAM, CLASS_SUM}  # the counts are public
    # replace-one, the label kept: x x^T - x' x'^T of Frobenius norm <= sqrt(2) C^2, x - x' of norm <= 2 C
    assert releases[GRAM].sensitivity == math.sqrt(2) * clip**2 and releases[CLASS_SUM].sensitivity == 2 * clip
    mu = gaussian_mu(epsilon, 1e-5)
    assert releases[GRAM].sigma == pytest.approx(math.sqrt(2) * clip**2 / (mu * math.sqrt(share)), rel=1e-12)
    assert releases[CLASS_SUM].sigma == pytest.approx(2 * clip / (mu * math.sqrt(1 - share)), rel=1e-12)
    # the two releases together are exactly the budget, by the curve and by dp-accounting's PLD accountant
    assert gaussian_delta(composed_mu(releases), epsilon) == pytest.approx(1e-5, rel=1e-6)
    accountant = pld_privacy_accountant.PLDAccountant()
    accountant.compose(composed_event(releases))
    assert accountant.get_epsilon(1e-5) == pytest.approx(epsilon, rel=1e-3)


def test_ncm_spends_the_whole_budget_on_the_class_sums():
    releases = calibrate(DpSettings(epsilon=1.0, clip=2.0), (CLASS_SUM, "class_count"))
    assert list(releases) == [CLASS_SUM]
    assert releases[CLASS_SUM].sigma == pytest.approx(2 * 2.0 / gaussian_mu(1.0, 1e-5))


def test_a_statistic_without_a_known_sensitivity_is_refused():
    with pytest.raises(ValueError, match="class_moment"):
        calibrate(DpSettings(epsilon=1.0), (CLASS_SUM, "class_moment"))


@pytest.mark.parametrize("source", [SeededNoise(5), SecureNoise()], ids=["seeded", "csprng"])
@pytest.mark.parametrize("share", [1.0, 0.25])
def test_the_noise_has_the_calibrated_deviation_and_a_symmetric_gram(source, share):
    d, sigma_g, sigma_s = 300, 3.0, 0.5
    stats = {GRAM: torch.zeros(d, d, dtype=torch.float64), CLASS_SUM: torch.zeros(40, d, dtype=torch.float64)}
    add_noise(stats, {GRAM: Release(1.0, sigma_g), CLASS_SUM: Release(1.0, sigma_s)}, source, share)
    gram = stats[GRAM]
    assert torch.equal(gram, gram.T)
    upper = gram[torch.triu_indices(d, d, 1).unbind()]
    # Off the diagonal sigma / sqrt(2): the Gaussian mechanism on (G_ii; sqrt(2) G_ij), whose norm is |G|_F.
    # Six standard errors of a sample deviation, 1 / sqrt(2 (n - 1)) relative, so that a fresh csprng draw fails
    # about once in 5e8 runs; at the smallest count (the diagonal's 300) a factor of sqrt(2) either way still fails
    off = sigma_g / math.sqrt(2)
    for drawn, sigma in ((upper, off), (gram.diagonal(), sigma_g), (stats[CLASS_SUM].flatten(), sigma_s)):
        tolerance = 6 / math.sqrt(2 * (drawn.numel() - 1))
        assert tolerance < 1 - 1 / math.sqrt(2)
        assert float(drawn.std()) == pytest.approx(sigma * math.sqrt(share), rel=tolerance)
        assert abs(float(drawn.mean())) < 6 * sigma / math.sqrt(drawn.numel())


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**31), d=st.integers(1, 8))
def test_the_grams_noise_is_the_gaussian_mechanism_on_a_vector_of_norm_the_frobenius_norm(seed, d):
    """The noised coordinates ``(G_ii; sqrt(2) G_ij)`` of a symmetric matrix have norm ``|G|_F``: so one record's
    ``x x^T`` moves them by ``|x|^2``, the sensitivity the calibration assumes, and they carry i.i.d. noise."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(d, 1, generator=gen, dtype=torch.float64)
    g = x @ x.T
    rows, cols = torch.triu_indices(d, d, 1).unbind()
    coordinates = torch.cat([g.diagonal(), math.sqrt(2) * g[rows, cols]])
    assert float(coordinates.norm()) == pytest.approx(float(g.norm()), rel=1e-12)
    assert float(g.norm()) == pytest.approx(float(x.norm()) ** 2, rel=1e-12)


def test_block_grams_get_symmetric_noise_per_block():
    blocks = torch.zeros(3, 20, 20, dtype=torch.float64)
    add_noise({GRAM: blocks}, {GRAM: Release(1.0, 1.0)}, SeededNoise(0))
    assert torch.equal(blocks, blocks.transpose(1, 2)) and bool((blocks != 0).all())


def test_seeded_noise_repeats_per_task_and_the_csprng_does_not():
    draw = [noise_source(7, task).normal((5,)) for task in (0, 0, 1)]
    assert torch.equal(draw[0], draw[1]) and not torch.equal(draw[0], draw[2])
    assert isinstance(noise_source(-1, 0), SecureNoise)
    assert not torch.equal(noise_source(-1, 0).normal((5,)), noise_source(-1, 0).normal((5,)))


@settings(max_examples=60, deadline=None)
@given(
    log_norm=st.floats(-6, 6),
    clip=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**31),
    label=st.integers(0, 3),
)
def test_one_record_of_any_norm_moves_the_statistics_by_at_most_the_sensitivity(log_norm, clip, seed, label):
    """Add one record of norm ``10^log_norm`` to a data set: the Gram moves by at most ``C^2`` (Frobenius), the
    class sums by at most ``C``, whatever the norm; the clipped record itself has norm ``min(|x|, C)``."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(30, 6, generator=gen, dtype=torch.float64) * 5
    labels = torch.randint(0, 4, (30,), generator=gen)
    record = torch.randn(1, 6, generator=gen, dtype=torch.float64)
    record *= 10.0**log_norm / record.norm()
    without = sums(feature_map(x, None, clip=clip), labels, (0, 4), gram=True)
    both = torch.cat([x, record])
    with_it = sums(feature_map(both, None, clip=clip), torch.cat([labels, torch.tensor([label])]), (0, 4), gram=True)
    gram = lambda stats: stats["gram_factor"].T @ stats["gram_factor"]  # noqa: E731
    slack = 1 + 1e-9
    assert float((gram(with_it) - gram(without)).norm()) <= clip**2 * slack + 1e-9 * float(gram(without).norm())
    assert float((with_it["class_sum"] - without["class_sum"]).norm()) <= clip * slack
    clipped = feature_map(record, None, clip=clip)
    assert float(clipped.norm()) == pytest.approx(min(10.0**log_norm, clip), rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(
    blocks=st.integers(2, 5),
    log_norms=st.tuples(st.floats(-3, 3), st.floats(-3, 3)),
    clip=st.floats(0.1, 10.0),
    seed=st.integers(0, 2**31),
)
def test_a_block_gram_under_the_per_block_clip_moves_by_the_smaller_sensitivity(blocks, log_norms, clip, seed):
    """Each of a record's K blocks clipped to C / sqrt(K): replacing it by another of its class moves the Gram's
    diagonal blocks by at most sqrt(2) C^2 / sqrt(K) (Frobenius, over all blocks), the bound ``calibrate`` states,
    and its class sum by at most 2C, as a whole-row clip does; each block and the row stay within their bounds."""
    gen = torch.Generator().manual_seed(seed)
    width = 3 * blocks
    x = torch.randn(20, width, generator=gen, dtype=torch.float64) * 4
    a, b = (torch.randn(1, width, generator=gen, dtype=torch.float64) * 10.0**n for n in log_norms)
    a[:, : width // blocks] *= 50  # one block holding most of a record's energy: the whole-row clip's worst case

    def stats(record: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        rows = feature_map(torch.cat([x, record]), None, clip=clip, blocks=blocks).view(-1, blocks, width // blocks)
        return torch.einsum("nkf,nkg->kfg", rows, rows), rows.sum(0)

    release = calibrate(DpSettings(epsilon=1.0, clip=clip), (GRAM, CLASS_SUM), gram_blocks=blocks)
    (gram_a, sum_a), (gram_b, sum_b) = stats(a), stats(b)
    slack = 1 + 16 * torch.finfo(torch.float64).eps
    assert release[GRAM].sensitivity == pytest.approx(math.sqrt(2) * clip**2 / math.sqrt(blocks))
    assert float((gram_a - gram_b).norm()) <= release[GRAM].sensitivity * slack
    assert float((sum_a - sum_b).norm()) <= release[CLASS_SUM].sensitivity * slack
    clipped = feature_map(a, None, clip=clip, blocks=blocks)
    assert float(clipped.norm()) <= clip * slack
    assert float(clipped.view(blocks, -1).norm(dim=1).max()) <= clip / math.sqrt(blocks) * slack


def test_a_record_under_the_clip_is_unchanged():
    x = torch.tensor([[0.3, 0.4]], dtype=torch.float64)
    assert torch.equal(feature_map(x, None, clip=1.0), x)
    assert torch.equal(feature_map(x, None), x)  # no clip: no change


def test_the_ledger_refuses_a_release_over_the_budget_naming_spent_and_asked():
    ledger = PrivacyLedger(1.0, 1e-5)
    whole = gaussian_mu(1.0, 1e-5)
    ledger.spend(0, whole, "task 0's features step")
    ledger.spend(1, whole, "task 1's features step")  # other records: parallel composition
    assert ledger.epsilon_spent() == pytest.approx(1.0, rel=1e-6)
    with pytest.raises(BudgetExceeded, match=r"task 0's records at epsilon 0\.5.*spent epsilon 1\b.*over"):
        ledger.check(0, gaussian_mu(0.5, 1e-5), "a second release")
    half = PrivacyLedger(1.0, 1e-5)
    half.spend(2, whole / math.sqrt(2), "half")
    half.spend(2, whole / math.sqrt(2), "the other half")  # exactly the budget: allowed
    with pytest.raises(BudgetExceeded):
        half.spend(2, 1e-3, "a crumb more")
    restored = PrivacyLedger(1.0, 1e-5)
    restored.load(half.state())
    assert restored.spent == half.spent


@pytest.mark.parametrize(
    "values, match",
    [
        ({"epsilon": -1.0}, "dp.epsilon"),
        ({"epsilon": 1.0, "delta": 0.0}, "dp.delta"),
        ({"epsilon": 1.0, "clip": 0.0}, "dp.clip"),
        ({"epsilon": 1.0, "gram_share": 1.0}, "dp.gram_share"),
        ({"epsilon": 1.0, "seed": -2}, "dp.seed"),
    ],
)
def test_bad_settings_are_refused_by_name(values, match):
    with pytest.raises(ValueError, match=match):
        DpSettings.parse(values)


def test_zero_and_infinite_epsilon_are_off():
    assert not DpSettings().enabled and not DpSettings(epsilon=math.inf).enabled and DpSettings(epsilon=8.0).enabled


@pytest.mark.parametrize(
    "changes, match",
    [
        ({"method": "lorm"}, r"method 'lorm' trains on its clients' records.*set dp.mode=local"),
        ({"method": "lorm-ridge"}, r"'lorm-ridge' reads training records outside.*covers only \[.*'ncm', 'ridge'\]"),
        ({"method": "ridge", "settings": {"dp": {"epsilon": 1.0}, "data": {"validation": 5}}}, "data.validation"),
        (  # the screening reads un-noised statistics and one record can flip a client's verdict
            {"method": "ncm", "settings": {"dp": {"epsilon": 1.0}, "robust": {"enabled": True}}},
            "central with robust.enabled.*one record can flip a whole client's verdict",
        ),
    ],
)
def test_a_run_whose_records_the_noise_does_not_cover_is_refused(changes, match):
    values = {"dataset": "synthetic-text", "settings": {"dp": {"epsilon": 1.0}}} | changes
    with pytest.raises(ValueError, match=match):
        validate(RunConfig(**values))


def test_the_robust_mode_screens_a_private_run_only_where_it_sees_noised_updates():
    """Local mode's updates are noised by their clients: screening them is post-processing, so it stays allowed."""
    local = {"epsilon": 4.0, "mode": "local"}
    assert RunConfig(method="lorm", settings={"dp": local, "robust": {"enabled": True}}).section(DpSettings).local


def test_describe_lists_the_settings():
    text = describe("dp")
    for key in ("epsilon", "delta", "clip", "gram_share", "lambda_scale", "seed", "sample_rate", "gram_clip", "mode"):
        assert f"dp.{key} (" in text


@pytest.mark.parametrize("count", [1, 2001, 20_001])
def test_the_csprng_fills_every_draw_across_its_reads(count, monkeypatch):
    monkeypatch.setattr(SecureNoise, "CHUNK", 1000)  # several reads of os.urandom, an odd count
    draws = SecureNoise().normal((count,))
    assert draws.shape == (count,) and bool(torch.isfinite(draws).all()) and float(draws.abs().max()) < 7
    if count > 10_000:
        assert float(draws.std()) == pytest.approx(1.0, rel=0.05)
        halves = draws[: count // 2], draws[count // 2 :]  # the cosines and the sines of the pairs alike
        assert abs(float(halves[0].std() - halves[1].std())) < 0.05
