"""The robust mode's screen (server/robust_screen.py, server/robust.py): what it clips, refuses and leaves alone."""

from __future__ import annotations

import math

import pytest
import torch

from common.aggregation.base import Aggregator
from common.run.config import RunConfig
from common.run.settings import RobustSettings
from common.wire.instructions import LoraStep
from common.wire.messages import ClientUpdate, LowRank, Phase, RoundPlan
from common.wire.tensors import FACTOR, GRAM, HEAD_BIAS, HEAD_WEIGHT, LORA, low_rank_tensors
from engine.attacks import GRAM_SCALE, tamper
from server.robust import screen_and_fold
from server.robust_screen import Screen
from server.strategies import make_strategy
from server.strategies.fold import Fold

from tolerance import rel_tolerance
from unit_helpers import LORA_SPEC, unit_config
from updates import plan_update

F64 = torch.float64
CLIENTS = 7


def b_round() -> tuple[RoundPlan, object]:
    """LoRM's first B-round of task 0 on the unit model, with a shared A and B starting at zero."""
    strategy = make_strategy(unit_config(num_clients=CLIENTS), LORA_SPEC)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    assert plan.expect(LoraStep).train_factors == ("B",)
    return plan, strategy


def honest(plan: RoundPlan, index: int, noise: float = 0.2) -> ClientUpdate:
    """An update whose B moves along one direction shared by every honest client, plus noise, and
    whose Grams and head are those of ``12 + index`` samples of similar inputs."""
    common = torch.Generator().manual_seed(99)
    g = torch.Generator().manual_seed(1000 + index)
    n = 12 + index
    factors, grams, lora = {}, {}, plan.low_rank(LORA)
    for name, (d_out, d_in) in LORA_SPEC.layers.items():
        rank = lora[name].b.shape[1] if name in lora else 2
        shared = torch.randn(d_out, rank, generator=common)
        factors[name] = {"B": lora[name].b + shared + noise * torch.randn(d_out, rank, generator=g)}
        x = torch.randn(n, d_in, generator=g, dtype=F64)
        grams[name] = (x * x).sum(0)
    x = torch.randn(n, LORA_SPEC.feature_dim, generator=g, dtype=F64)
    weight, bias = plan.get(HEAD_WEIGHT), plan.get(HEAD_BIAS)
    assert weight is not None and bias is not None
    shared_head = torch.randn(weight.shape, generator=common)
    return plan_update(
        plan,
        index,
        n,
        factors=factors,
        grams=grams,
        head_weight=weight + 0.1 * shared_head + 0.02 * torch.randn(weight.shape, generator=g),
        head_bias=bias + 0.01 * torch.randn(bias.shape, generator=g),
        head_gram=x.T @ x if plan.expect(LoraStep).head_gram else None,
        train_loss=1.0,
    )


def screened_fold(
    settings: RobustSettings, updates: list[ClientUpdate], plan: RoundPlan, strategy
) -> tuple[dict, Fold]:
    """The step's fold, its updates screened and folded as the robust mode does; the screening's report."""
    fold = strategy.fold(plan)
    for u in updates:
        fold.aggregator.check(u)
    report = screen_and_fold(settings, plan, fold.aggregator, list(range(len(updates))), updates.__getitem__)
    return report, fold


def screened(
    settings: RobustSettings, updates: list[ClientUpdate], plan: RoundPlan, strategy
) -> tuple[dict, Aggregator]:
    report, fold = screened_fold(settings, updates, plan, strategy)
    return report, fold.aggregator


def per_sample_trace(update: ClientUpdate, layer: str) -> float:
    return float(update.named(GRAM)[layer].sum()) / update.num_samples


def b_of(update: ClientUpdate, layer: str) -> torch.Tensor:
    """The update's trained B of ``layer``."""
    return update.by_layer(FACTOR)[layer]["B"]


def test_off_by_default_and_its_settings_are_checked():
    assert RunConfig().section(RobustSettings).enabled is False
    for bad, words in (
        ({"kappa": 0.5}, "robust.kappa"),
        ({"action": "drop"}, "robust.action"),
        ({"min_cosine": 2.0}, "robust.min_cosine"),
        ({"min_clients": 2}, "robust.min_clients"),
        ({"relative_cosine": 1.0}, "robust.relative_cosine"),
    ):
        with pytest.raises(ValueError, match=words):
            RobustSettings.parse(bad)


def test_honest_clients_pass_untouched():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report["refused"] == [] and report["clipped"] == [] and report["spared"] == []
    assert aggregator.count == CLIENTS
    assert all(v["cosine"] > 0.5 for v in report["clients"].values())


def test_a_scaled_gram_is_clipped_onto_kappa_times_the_median_per_sample_trace():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    updates[3] = tamper("scale-grams", updates[3], plan)
    settings = RobustSettings(enabled=True, kappa=4.0)
    screen = Screen(settings, plan)
    for u in updates:
        screen.observe(u)
    verdict = screen.judge(updates[3])
    assert not verdict.refused and set(verdict.clipped) >= {"gram/l1", "gram/l2"}
    clipped = screen.apply(updates[3], verdict)
    for layer in LORA_SPEC.layers:
        traces = sorted(per_sample_trace(u, layer) for u in updates)
        median = traces[CLIENTS // 2]
        assert per_sample_trace(updates[3], layer) > GRAM_SCALE / 10 * median  # the attack
        assert per_sample_trace(clipped, layer) == pytest.approx(4.0 * median, rel=rel_tolerance(F64))
    assert torch.equal(b_of(clipped, "l1"), b_of(updates[3], "l1"))  # nothing else moves
    for i in (0, 1, 2, 4, 5, 6):
        assert not screen.judge(updates[i]).clipped


def test_a_scaled_factor_is_clipped_around_where_the_step_started_it_or_refused():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    updates[2] = tamper("scale-factors", updates[2], plan)
    report, _ = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report["clipped"] == [2] and report["refused"] == []
    assert "factor/l1/B" in report["clients"]["2"]["clipped"]
    screen = Screen(RobustSettings(enabled=True, kappa=4.0), plan)
    for u in updates:
        screen.observe(u)
    clipped = screen.apply(updates[2], screen.judge(updates[2]))
    start = plan.low_rank(LORA)["l1"].b
    moved = [float((b_of(u, "l1") - start).norm()) for u in updates]
    median = sorted(moved)[CLIENTS // 2]
    assert float((b_of(clipped, "l1") - start).norm()) == pytest.approx(4.0 * median, rel=rel_tolerance(torch.float32))
    report, aggregator = screened(RobustSettings(enabled=True, action="refuse"), updates, plan, strategy)
    assert report["refused"] == [2] and aggregator.count == CLIENTS - 1
    assert "exceeds robust.kappa 2 x the step's median" in report["clients"]["2"]["refused"]


def test_a_sign_flipped_factor_is_refused_for_its_direction():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    flipped = tamper("flip-sign", updates[5], plan)
    assert math.isclose(  # the same norms: only the direction gives it away
        float(b_of(flipped, "l2").norm()), float(b_of(updates[5], "l2").norm()), rel_tol=1e-6
    )
    updates[5] = flipped
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report["refused"] == [5] and aggregator.count == CLIENTS - 1
    assert "points away from the other clients'" in report["clients"]["5"]["refused"]
    assert report["clients"]["5"]["cosine"] < -0.5


def test_an_update_that_agrees_far_less_than_the_median_client_is_refused():
    """Trained on wrong labels: an honest norm and a positive cosine, but much lower than the others'."""
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    suspect = honest(plan, 6, noise=30.0)  # its factors: mostly its own direction...
    g = torch.Generator().manual_seed(66)
    weight, bias = suspect.tensors[HEAD_WEIGHT], suspect.tensors[HEAD_BIAS]
    suspect.tensors[HEAD_WEIGHT] = weight + 3.0 * torch.randn(weight.shape, generator=g)
    suspect.tensors[HEAD_BIAS] = bias + 0.1 * torch.randn(bias.shape, generator=g)  # ...and its head
    updates[6] = suspect
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    cosine = {int(i): v["cosine"] for i, v in report["clients"].items()}
    median = sorted(cosine.values())[CLIENTS // 2]
    assert 0.0 < cosine[6] < 0.5 * median  # positive: the absolute min_cosine alone lets it through
    assert report["refused"] == [6] and "far less than the step's median client's" in report["clients"]["6"]["refused"]
    report, _ = screened(RobustSettings(enabled=True, relative_cosine=0.0), updates, plan, strategy)
    assert report["refused"] == []


def test_never_more_than_a_minority_is_refused_the_worst_first():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    for i in (0, 1, 2, 3):  # a majority flipped: the screen's premise fails, it keeps a majority
        updates[i] = tamper("flip-sign", updates[i], plan)
    report, aggregator = screened(RobustSettings(enabled=True, min_cosine=0.9), updates, plan, strategy)
    assert len(report["refused"]) == (CLIENTS - 1) // 2 and aggregator.count == CLIENTS - (CLIENTS - 1) // 2
    cosine = {int(i): v["cosine"] for i, v in report["clients"].items()}
    kept_worst = min(cosine[i] for i in range(CLIENTS) if i not in report["refused"])
    assert all(cosine[i] <= kept_worst for i in report["refused"])
    assert report["spared"]  # over the bound, kept, and said so


def test_too_few_clients_are_folded_unscreened():
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(2)]
    updates[1] = tamper("scale-factors", updates[1], plan)
    report, aggregator = screened(RobustSettings(enabled=True), updates, plan, strategy)
    assert report == {"screened": False, "why": "2 updates < robust.min_clients 3"} and aggregator.count == 2


def test_screened_folds_equal_folding_the_clipped_updates_directly():
    """The screen changes what is folded, never how: the strategy's merge of the clipped updates."""
    plan, strategy = b_round()
    updates = [honest(plan, i) for i in range(CLIENTS)]
    updates[4] = tamper("scale-grams", updates[4], plan)
    settings = RobustSettings(enabled=True)
    _, screened_step = screened_fold(settings, updates, plan, strategy)
    screen = Screen(settings, plan)
    for u in updates:
        screen.observe(u)
    strategy2 = make_strategy(unit_config(num_clients=CLIENTS), LORA_SPEC)
    strategy2.begin_task(0)
    direct = strategy2.fold(strategy2.configure(0, 0, Phase.TRAIN))
    for u in updates:
        direct.aggregator.fold(screen.apply(u, screen.judge(u)))
    screened_step.finish()
    screened_b = {name: lr.b.clone() for name, lr in strategy.view().items()}
    direct.finish()
    for name, lr in strategy2.view().items():
        assert torch.equal(lr.b, screened_b[name])


def test_plan_starts_name_the_factors_a_client_trains():
    from server.robust_measures import plan_starts

    plan = RoundPlan(
        run_id="r",
        phase=Phase.TRAIN,
        task=0,
        round=0,
        class_range=(0, 2),
        seen_classes=2,
        instruction=LoraStep(),
        tensors=low_rank_tensors(LORA, {"l1": LowRank(torch.ones(5, 2), torch.zeros(2, 4))}),
    )
    assert set(plan_starts(plan)) == {"factor/l1/B", "factor/l1/A"}
