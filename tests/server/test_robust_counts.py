"""The robust mode against claimed counts: H4, a client's ``num_samples``, and M3, a
features step's class counts and class means. Each test is the attack first, then what the guard does."""

from __future__ import annotations

import math

import pytest
import torch
from test_robust import CLIENTS, b_of, b_round, honest, screened, screened_fold

from common.merges.grams import gram_factor
from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from common.wire.tensors import GRAM, HEAD_GRAM, STAT
from engine.attacks import INFLATE, tamper
from server.robust import screen_and_fold
from server.robust_measures import CLASS_COUNT, measure, reweigh, tensor_role
from server.robust_screen import Screen
from server.strategies import make_strategy

from tolerance import assert_close_to_dtype, rel_tolerance
from unit_helpers import LORA_SPEC, unit_config
from updates import plan_update

F64 = torch.float64
CLASSES = 3  # task 0 of the unit model's 6 classes in 2 tasks
# Each client's samples per class: uneven as under Dirichlet beta 0.5 (client 2 holds most of class 0,
# client 5 none of it), the honest federation the features tests screen.
COUNTS = [(2, 5, 3), (1, 4, 6), (14, 1, 2), (3, 3, 3), (2, 6, 1), (0, 3, 7), (4, 2, 4)]


def screen_of(settings: RobustSettings, plan: RoundPlan, updates: list[ClientUpdate]) -> Screen:
    screen = Screen(settings, plan)
    for u in updates:
        screen.observe(u)
    if screen.has_classes:
        for u in updates:
            screen.observe_classes(u)
    return screen


# ----------------------------------------------------------------------------- H4: num_samples


def test_h4_an_inflated_sample_claim_is_clipped_to_kappa_times_the_median_count():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    updates[3] = tamper("inflate-samples", updates[3], plan)
    assert updates[3].num_samples == INFLATE * 15  # the attack: 150 claimed, every per-sample measure honest
    screen = screen_of(RobustSettings(enabled=True), plan, updates)
    verdict = screen.judge(updates[3])
    assert not verdict.refused and verdict.ratio == pytest.approx(150 / 16)
    clipped = screen.apply(updates[3], verdict)
    bound = math.floor(2.0 * 16)  # kappa x the median claim (12, 13, 14, 16, 17, 18 and 150: 16)
    assert clipped.num_samples == bound
    w = bound / updates[3].num_samples
    for layer in LORA_SPEC.layers:  # its Grams shrink with the count: per sample they are as they were
        assert_close_to_dtype(clipped.named(GRAM)[layer], updates[3].named(GRAM)[layer] * w, F64)
    head_gram, was = clipped.get(HEAD_GRAM), updates[3].get(HEAD_GRAM)
    assert head_gram is not None and was is not None
    assert_close_to_dtype(head_gram, was * w, F64)
    assert torch.equal(b_of(clipped, "l1"), b_of(updates[3], "l1"))  # a change is no sum: kept
    for i in (0, 1, 2, 4, 5, 6):
        assert not screen.judge(updates[i]).clipped


def test_h4_the_merge_weighs_a_clipped_claim_as_the_bound():
    """Screened, the inflated client's share of the Gram-weighted merge is that of the same client with
    ``kappa x median`` samples: the merge equals folding its honest update reweighed to the bound."""
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    attacked = updates.copy()
    attacked[3] = tamper("inflate-samples", updates[3], plan)
    report, screened_step = screened_fold(RobustSettings(enabled=True), attacked, plan, strategy)
    assert report["clipped"] == [3] and report["clients"]["3"]["clipped"]["num_samples"] < 1
    expected = make_strategy(unit_config(num_clients=CLIENTS), LORA_SPEC)
    expected.begin_task(0)
    fold = expected.fold(plan)
    direct = fold.aggregator
    for i, u in enumerate(updates):
        direct.fold(reweigh(u, 32) if i == 3 else u)
    assert screened_step.aggregator.num_samples == direct.num_samples == sum(12 + i for i in range(CLIENTS)) - 15 + 32
    screened_step.finish()
    fold.finish()
    for name, lr in expected.view().items():
        assert_close_to_dtype(strategy.view()[name].b, lr.b, torch.float32)


def test_h4_refuse_mode_drops_an_inflated_claim_naming_the_count():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    updates[5] = tamper("inflate-samples", updates[5], plan)
    report, aggregator = screened(RobustSettings(enabled=True, action="refuse"), updates, plan, strategy)
    assert report["refused"] == [5] and aggregator.count == CLIENTS - 1
    assert report["clients"]["5"]["refused"].startswith("num_samples: its count measure 170 exceeds robust.kappa 2")


# ----------------------------------------------------------------------------- M3: features steps


def features_round() -> tuple[RoundPlan, object]:
    strategy = make_strategy(unit_config(method="ncm", num_clients=CLIENTS), LORA_SPEC)
    strategy.begin_task(0)
    return strategy.configure(0, 0, Phase.FEATURES), strategy


def centres() -> torch.Tensor:
    """``(CLASSES, F)``: well-separated class centres on a common offset (features are not centred)."""
    g = torch.Generator().manual_seed(5)
    return 3.0 + 2.0 * torch.randn(CLASSES, LORA_SPEC.feature_dim, generator=g, dtype=F64)


def features_update(
    plan: RoundPlan, index: int, counts: tuple[int, ...], means: torch.Tensor | None = None, gram: bool = False
) -> ClientUpdate:
    """Client ``index``'s statistics (``ncm``'s; ``gram``: with a Gram factor, as ``ridge``'s) of ``counts[k]``
    samples of class ``k`` around ``means`` (the centres)."""
    g = torch.Generator().manual_seed(300 + index)
    means = centres() if means is None else means
    labels = torch.cat([torch.full((c,), k) for k, c in enumerate(counts)])
    x = means[labels] + 0.5 * torch.randn(len(labels), LORA_SPEC.feature_dim, generator=g, dtype=F64)
    one_hot = torch.nn.functional.one_hot(labels, CLASSES).to(F64)
    stats = {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0)} | (
        {"gram_factor": gram_factor(x)} if gram else {}
    )
    return plan_update(plan, index, len(labels), stats=stats)


def test_m3_honest_non_iid_clients_pass_untouched():
    plan, strategy = features_round()
    updates = [features_update(plan, i, c) for i, c in enumerate(COUNTS)]
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report["refused"] == [] and report["clipped"] == [] and aggregator.count == CLIENTS
    assert all(v["cosine"] > 0.5 for v in report["clients"].values())  # class means agree with the others'


def test_m3_a_class_count_past_the_others_median_class_total_reweighs_the_update():
    """The attack: client 3 claims 200 samples of class 0, honest-looking (its mean is class 0's, its
    per-sample measures honest). The other clients' class totals are 23, 21 and 23: its class 0 may
    hold at most 2 x 23; its claim at most 2 x the median claim (10). It is reweighed onto the
    tighter bound, its class means kept; refused in refuse mode."""
    plan, strategy = features_round()
    updates = [features_update(plan, i, c) for i, c in enumerate(COUNTS)]
    updates[3] = features_update(plan, 3, (200, 3, 3), gram=True)
    screen = screen_of(RobustSettings(enabled=True), plan, updates)
    assert screen.count_bounds(3, {CLASS_COUNT: updates[3].named(STAT)["class_count"]}) == [
        ("num_samples", 206.0, 20.0, 10.0),
        (f"{CLASS_COUNT}[0]", 200.0, 46.0, 23.0),
    ]
    verdict = screen.judge(updates[3])
    assert not verdict.refused and "num_samples" in verdict.clipped
    clipped = screen.apply(updates[3], verdict)
    count, sums = clipped.named(STAT)["class_count"], clipped.named(STAT)["class_sum"]
    assert clipped.num_samples == 20 and float(count.sum()) == 20 and float(count[0]) <= 46
    assert torch.equal(count, count.round())  # whole counts, as a client sends
    seen = count > 0
    before = updates[3].named(STAT)["class_sum"] / updates[3].named(STAT)["class_count"][:, None]
    assert_close_to_dtype((sums / count.clamp(min=1)[:, None])[seen], before[seen], F64)  # its class means kept
    w = clipped.num_samples / updates[3].num_samples
    factor_before, factor_after = updates[3].named(STAT)["gram_factor"], clipped.named(STAT)["gram_factor"]
    assert float(factor_after.square().sum()) == pytest.approx(
        w * float(factor_before.square().sum()), rel=rel_tolerance(F64, terms=factor_before.numel())
    )
    updates[3] = features_update(plan, 3, (200, 3, 3))
    report, _ = screened(RobustSettings(enabled=True, action="refuse"), updates, plan, strategy)
    assert report["refused"] == [3] and "exceeds robust.kappa 2" in report["clients"]["3"]["refused"]


def test_m3_the_class_bound_binds_when_a_task_has_more_classes_than_the_median_client_samples():
    """With many classes per task (the quick protocol: 30 classes, about 20 samples each, a median
    client of about 55), the class bound is the tighter one: a client whose claim is within bounds
    but who holds more of one class than kappa x the others' median class total is reweighed onto it."""
    plan, strategy = features_round()
    screen = Screen(RobustSettings(enabled=True), plan)
    screen.samples = {i: 55 for i in range(CLIENTS)}
    screen.class_total = torch.full((30,), 20.0, dtype=F64)
    counts = torch.zeros(30, dtype=F64)
    counts[7] = 60.0
    screen.class_total = screen.class_total + counts
    (samples, _, _, _), (what, value, bound, others) = screen.count_bounds(0, {CLASS_COUNT: counts})
    assert samples == "num_samples" and (what, value, bound, others) == (f"{CLASS_COUNT}[7]", 60.0, 40.0, 20.0)


@pytest.mark.parametrize("pull", ["swap", "away"])
def test_m3_a_class_mean_pulled_elsewhere_is_refused(pull):
    """The attack: client 4 sends honest counts and Gram but its class means elsewhere (``swap``: each
    class the next one's prototype; ``away``: mirrored through the centre), so that, folded, it drags
    each prototype towards another class."""
    plan, strategy = features_round()
    updates = [features_update(plan, i, c) for i, c in enumerate(COUNTS)]
    c = centres()
    means = c.roll(1, 0) if pull == "swap" else 2 * c.mean(0) - c
    updates[4] = features_update(plan, 4, COUNTS[4], means)
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report["refused"] == [4] and aggregator.count == CLIENTS - 1
    assert (
        "agrees with the other clients' far less" in report["clients"]["4"]["refused"]
        or "points away" in (report["clients"]["4"]["refused"])
    )
    assert report["clients"]["4"]["cosine"] < 0.0


def test_m3_reweighing_keeps_what_validation_checks():
    """:func:`reweigh` up (an attacker's claim) gives statistics the aggregator still admits, and down
    (the guard's clip) class means as they were."""
    plan, strategy = features_round()
    update = features_update(plan, 2, COUNTS[2])
    assert update.named(STAT)["class_count"].tolist() == [14, 1, 2]
    for samples in (3 * update.num_samples + 1, 5):
        moved = reweigh(update, samples)
        strategy.aggregator(plan).check(moved)
        assert moved.num_samples == samples and float(moved.named(STAT)["class_count"].sum()) == samples
    tensors = {"stat/class_sum": update.named(STAT)["class_sum"]}
    assert tensor_role("stat/class_sum", tensors["stat/class_sum"]) == "first moment"
    assert measure("first moment", "stat/class_sum", tensors["stat/class_sum"], {}, update.num_samples) > 0


def test_the_features_screen_runs_through_screen_and_fold_in_one_more_pass():
    plan, strategy = features_round()
    updates = [features_update(plan, i, c) for i, c in enumerate(COUNTS)]
    loads: list[int] = []

    def load(i: int) -> ClientUpdate:
        loads.append(i)
        return updates[i]

    screen_and_fold(RobustSettings(enabled=True), plan, strategy.aggregator(plan), list(range(CLIENTS)), load)
    assert len(loads) == 4 * CLIENTS  # observe, observe_classes, judge, fold
