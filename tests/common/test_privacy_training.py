"""The trained methods' accounting (common/privacy/training.py): the calibration spends exactly the budget under
dp_accounting's PLD accountant with the replace-one adjacency, the Grams take their share, and the ledger refuses a
release beyond the plan."""

from __future__ import annotations

import math

import dp_accounting
import pytest
from dp_accounting import NeighboringRelation
from dp_accounting.pld import PLDAccountant

from common.methods.checks import validate
from common.privacy.gaussian import gaussian_mu
from common.privacy.ledger import BudgetExceeded
from common.privacy.training import TrainingLedger, training_noise
from common.run.config import RunConfig
from common.run.settings import DpSettings

DELTA = 1e-5


def independent_epsilon(z: float, q: float, steps: int, rounds: int, z_gram: float, grams: int) -> float:
    """The same composition written out, with a fresh accountant at a finer discretisation: a Gram release of
    deviation ``z_G`` times its per-record bound moves by ``sqrt(2)`` of it when a record is replaced, the Gaussian
    that an add-or-remove accountant reads as multiplier ``z_G / sqrt(2)``."""
    sgd = dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(z))
    accountant = PLDAccountant(NeighboringRelation.REPLACE_ONE, value_discretization_interval=1e-4)
    accountant.compose(dp_accounting.SelfComposedDpEvent(sgd, steps * rounds))
    if grams:
        gram = dp_accounting.GaussianDpEvent(2 * z_gram / math.sqrt(2))  # replace-one reads m as distance 2 / m
        accountant.compose(dp_accounting.SelfComposedDpEvent(gram, grams))
    return accountant.get_epsilon(DELTA)


@pytest.mark.parametrize("epsilon", [1.0, 8.0])
@pytest.mark.parametrize("grams", [False, True])
def test_the_calibrated_noise_spends_exactly_the_budget(epsilon, grams):
    settings = DpSettings(epsilon=epsilon, delta=DELTA, mode="local", sample_rate=0.1)
    noise = training_noise(settings, 2, 3, grams)
    assert noise.steps == 20 and noise.rounds == 3 and noise.grams == (4 if grams else 0)
    spent = independent_epsilon(noise.noise_multiplier, 0.1, 20, 3, noise.gram_multiplier, noise.grams)
    assert abs(spent - epsilon) <= 1e-3 * epsilon
    # 2% less noise would overspend: the calibration is tight, not merely safe
    assert independent_epsilon(0.98 * noise.noise_multiplier, 0.1, 20, 3, noise.gram_multiplier, noise.grams) > epsilon
    if grams:  # the Grams' releases alone are Gaussian DP of mu^2 = gram_share x mu(budget)^2, at distance sqrt(2)
        mu = gaussian_mu(epsilon, DELTA)
        assert math.isclose(2 * noise.grams / noise.gram_multiplier**2, settings.gram_share * mu**2, rel_tol=1e-9)


def test_a_smaller_budget_needs_more_noise():
    z = [training_noise(DpSettings(epsilon=e, mode="local"), 1, 5, True).noise_multiplier for e in (0.5, 2, 8)]
    assert z == sorted(z, reverse=True)


def test_the_ledger_refuses_a_release_beyond_the_calibrated_plan_and_keeps_its_state():
    settings = DpSettings(epsilon=2.0, delta=DELTA, mode="local")
    noise = training_noise(settings, 1, 2, True)
    ledger = TrainingLedger(settings, noise)
    spent = []
    for _ in range(2):
        ledger.spend(0, 1, 1, "a round")
        spent.append(ledger.epsilon_spent(0))
    ledger.spend(0, 0, 1, "the task's Gram step")
    assert spent[0] < spent[1] < ledger.epsilon_spent(0) and abs(ledger.epsilon_spent(0) - 2.0) < 2e-3
    with pytest.raises(BudgetExceeded, match="through 3 rounds .* calibrated for 2 .* spent epsilon 2"):
        ledger.check(0, 1, 0, "a third round")
    with pytest.raises(BudgetExceeded, match="4 Gram releases"):
        ledger.check(0, 0, 1, "another Gram step")
    ledger.check(1, 1, 1, "task 1's first round")  # another task's records: their own budget
    again = TrainingLedger(settings, noise)
    again.load(ledger.state())
    assert again.done == ledger.done and again.epsilon_spent() == ledger.epsilon_spent()


@pytest.mark.parametrize(
    ("method", "mode", "refusal"),
    [
        ("lorm", "central", "set dp.mode=local"),
        ("fedavg", "central", "set dp.mode=local"),
        ("ridge", "local", "not by each client alone"),
        ("fedprox", "local", "differential privacy covers only"),
    ],
)
def test_each_method_takes_only_the_mode_that_covers_it(method, mode, refusal):
    with pytest.raises(ValueError, match=refusal):
        validate(RunConfig(method=method, settings={"dp": {"epsilon": 1.0, "mode": mode}}))


def test_the_trained_methods_accept_local_dp():
    for method in ("lorm", "lorm-b-only", "lorm-avg-tasks", "lorm-seq", "fedavg-lora", "fedavg"):
        RunConfig(method=method, settings={"dp": {"epsilon": 1.0, "mode": "local"}})


def test_the_stated_epsilon_is_the_replace_one_one_and_about_twice_the_add_or_remove_one():
    """The same noise read under add-or-remove states much less (5.6 for 8 here; about half at small budgets): the
    calibration is replace-one's."""
    settings = DpSettings(epsilon=8.0, delta=DELTA, mode="local", sample_rate=0.1)
    noise = training_noise(settings, 2, 3, False)
    sgd = dp_accounting.PoissonSampledDpEvent(0.1, dp_accounting.GaussianDpEvent(noise.noise_multiplier))
    accountant = PLDAccountant(NeighboringRelation.ADD_OR_REMOVE_ONE)
    accountant.compose(dp_accounting.SelfComposedDpEvent(sgd, noise.steps * 3))
    assert 4.0 < accountant.get_epsilon(DELTA) < 6.5 and noise.epsilon(3, 0, DELTA) == pytest.approx(8.0, rel=1e-3)
