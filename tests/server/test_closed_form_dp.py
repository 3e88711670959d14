"""The closed-form heads with a privacy budget (the dp section): the coordinator's noise on each step's sums, the
budget's refusal, the noise-floor lambda, what a run states, and a run without a budget unchanged."""

import json
import math

import pytest
import torch
from test_closed_form import tiny

from client.features import feature_map
from client.runtime import build_runtime
from common.aggregation.validate import UpdateRejected
from common.merges.grams import gram_factor
from common.privacy.gaussian import calibrate, gaussian_mu
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.wire.messages import EvalReport, ModelSpec, Phase, RoundPlan
from common.wire.model_card import CARD_FILE, ModelCard
from common.wire.tensors import STAT
from engine.simulation import run_inprocess
from lab.secure_rounds import secure_step
from server.coordinator import Coordinator
from server.run_state import State
from server.strategies import make_strategy

from unit_helpers import edit_named
from updates import plan_update

SPEC = ModelSpec(layers={}, feature_dim=5, num_classes=6)
DP = {"epsilon": 1.0, "seed": 11, "clip": 2.0}
PLAIN_RIDGE = {"ridge": {"fixed_lambda": 1.0, "holdout": 0}}  # what a private step sends: no held-out statistics


def strategy(dp: dict | None, method: str = "ridge", settings: dict | None = None):
    settings = (settings or {}) | ({"dp": dp} if dp is not None else {})
    return make_strategy(RunConfig(method=method, num_tasks=2, settings=settings), SPEC)


def client_update(plan, index, seed, clip):
    """Client ``index``'s statistics of 12 random rows (norms about sqrt(5)), clipped to ``clip`` (0: not)."""
    gen = torch.Generator().manual_seed(seed + index)
    lo, hi = plan.class_range
    y = torch.randint(lo, hi, (12,), generator=gen)
    x = feature_map(torch.randn(12, SPEC.feature_dim, generator=gen, dtype=torch.float64), None, clip=clip)
    one_hot = torch.nn.functional.one_hot(y - lo, hi - lo).double()
    stats = {"class_sum": one_hot.T @ x, "class_count": one_hot.sum(0), "gram_factor": gram_factor(x)}
    return plan_update(plan, index, 12, stats=stats)


def fold_task(head, task, seed):
    """Task ``task``'s features step: two clients' statistics, clipped as the run's clients clip them."""
    head.begin_task(task)
    plan = head.configure(task, 0, Phase.FEATURES)
    fold = head.fold(plan)
    aggregator = fold.aggregator
    clip = head.private.settings.clip if head.private is not None else 0.0
    for index in range(2):
        aggregator.fold(client_update(plan, index, seed, clip))
    fold.finish()


@pytest.mark.parametrize("method", ["ridge", "ncm"])
def test_statistics_of_unclipped_features_are_refused(method):
    """A client that skips the clip voids its own records' privacy; the coordinator does not take its sums for
    clipped ones: ``tr(G) <= n C^2`` and ``|S_c| <= n_c C`` must hold."""
    head = strategy(DP | {"clip": 1.0}, method)
    head.begin_task(0)
    plan = head.configure(0, 0, Phase.FEATURES)
    aggregator = head.aggregator(plan)
    unclipped = client_update(plan, 0, 5, 0.0)
    if method == "ncm":
        edit_named(unclipped, STAT, lambda stats: stats.pop("gram_factor"))
    with pytest.raises(UpdateRejected, match="not from features clipped to dp.clip = 1"):
        aggregator.fold(unclipped)
    clipped = client_update(plan, 0, 5, 1.0)
    if method == "ncm":
        edit_named(clipped, STAT, lambda stats: stats.pop("gram_factor"))
    aggregator.fold(clipped)
    assert aggregator.count == 1


def test_the_noise_lands_on_the_steps_gram_and_its_tasks_rows_at_the_calibrated_scale():
    private, plain = strategy(DP | {"clip": 1e6, "gram_share": 0.05}), strategy(None, settings=PLAIN_RIDGE)
    fold_task(private, 0, 10)  # the same updates (clip 1e6: none of the synthetic rows is clipped)
    fold_task(plain, 0, 10)
    noisy, exact = private.totals.value(), plain.totals.value()
    rows = slice(*private.tasks[0])
    others = torch.ones(SPEC.num_classes, dtype=torch.bool)
    others[rows] = False
    assert torch.equal(noisy["class_sum"][others], exact["class_sum"][others])  # no other task's rows touched
    assert torch.equal(noisy["class_count"], exact["class_count"])  # counts public: never noised
    assert not torch.equal(noisy["class_sum"][rows], exact["class_sum"][rows])
    change = noisy["gram"] - exact["gram"]
    assert torch.allclose(change, change.T, rtol=0, atol=1e-9 * float(change.abs().max()))
    releases = private.private.releases
    assert releases["gram"].sigma == pytest.approx(
        math.sqrt(2) * 1e12 / (gaussian_mu(1.0, 1e-5) * math.sqrt(0.05))
    )  # sqrt(2) C^2
    assert float(change.abs().max()) < 6 * releases["gram"].sigma  # noise of that scale, not more
    assert float(change.abs().max()) > 0.05 * releases["gram"].sigma  # nor far less


def test_a_step_over_the_budget_is_refused_before_it_starts():
    head = strategy(DP)
    fold_task(head, 0, 10)
    with pytest.raises(BudgetExceeded, match=r"task 0's features step would release .* spent epsilon 1\b"):
        head.configure(0, 0, Phase.FEATURES)
    head.begin_task(1)
    head.configure(1, 0, Phase.FEATURES)  # other records: allowed
    restarted = strategy(DP)  # the ledger survives a restart with the state
    restarted.load_state_tensors(head.state_tensors())
    with pytest.raises(BudgetExceeded):
        restarted.configure(0, 0, Phase.FEATURES)


def test_lambda_is_the_noise_floor_of_the_grams_summed_noise():
    head = strategy(DP | {"lambda_scale": 2.5})
    sigma = head.private.releases["gram"].sigma
    for task in (0, 1):
        fold_task(head, task, 10 + task)
        assert head.lam == pytest.approx(2.5 * math.sqrt(2) * sigma * math.sqrt(task + 1) * math.sqrt(SPEC.feature_dim))


def test_a_fixed_lambda_stays_fixed():
    head = make_strategy(
        RunConfig(method="ridge", num_tasks=2, settings={"dp": DP, "ridge": {"fixed_lambda": 7.0}}), SPEC
    )
    fold_task(head, 0, 10)
    assert head.lam == 7.0


@pytest.mark.parametrize("method", ["ridge", "ncm"])
def test_a_private_run_repeats_with_its_seed_and_differs_from_the_plain_run(method):
    lines: list[str] = []
    first = run_inprocess(tiny(method, settings={"dp": DP}), log=lines.append)
    again = run_inprocess(tiny(method, settings={"dp": DP}))
    other_seed = run_inprocess(tiny(method, settings={"dp": DP | {"seed": 12}}))
    plain = run_inprocess(tiny(method))
    assert torch.equal(first.head_weight, again.head_weight)
    assert not torch.equal(first.head_weight, other_seed.head_weight)
    assert not torch.equal(first.head_weight, plain.head_weight)
    # what the run states: every features step's log line and history entry, and metrics.json's privacy
    features = [line for line in lines if " features " in line and "merged" in line]
    assert len(features) == 2 and all("dp_epsilon 1.0" in line and "dp_delta 1e-05" in line for line in features)
    summary = first.summary()
    assert summary["privacy"]["epsilon"] == pytest.approx(1.0, rel=1e-6)
    assert summary["privacy"]["delta"] == 1e-5 and summary["privacy"]["mode"] == "central"
    assert summary["privacy"]["adjacency"] == "replace-one"
    # a seeded run says that it is private against nobody who holds its files (they hold the seed)
    assert summary["privacy"]["noise"].startswith(f"seeded (dp.seed {DP['seed']}): not private against anyone")
    assert [s["task"] for s in summary["privacy"]["steps"]] == [0, 1]
    assert "privacy" not in plain.summary()


@pytest.mark.parametrize("epsilon", [0.0, math.inf])
def test_no_budget_leaves_the_run_bit_identical(epsilon):
    off = run_inprocess(tiny("ridge", settings={"dp": {"epsilon": epsilon, "clip": 1e-3}}))
    plain = run_inprocess(tiny("ridge"))
    assert torch.equal(off.head_weight, plain.head_weight)
    assert off.matrix.summary() == plain.matrix.summary()
    assert json.dumps(off.history) == json.dumps(plain.history)  # NaN losses compare as text


def test_an_ensembles_blocks_are_noised_and_lambda_is_their_widths_noise_floor():
    ridge = {"rp_dim": 32, "blocks": 3, "lambda_rule": "average"}  # under dp no held-out statistics: any rule
    result = run_inprocess(tiny("ridge", settings={"ridge": ridge, "dp": DP}))
    steps = [h for h in result.history if h["phase"] == "features"]
    sigma = steps[0]["dp"]["sigma"]["gram"]
    # each of a sample's three blocks clipped to C / sqrt(3): the Gram's sensitivity, and its noise, a sqrt(3)th
    assert sigma == pytest.approx(calibrate(DpSettings(**DP), ("gram", "class_sum"), gram_blocks=3)["gram"].sigma)
    assert sigma == pytest.approx(calibrate(DpSettings(**DP), ("gram", "class_sum"))["gram"].sigma / math.sqrt(3))
    for task, step in enumerate(steps):
        assert step["ridge_lambda"] == pytest.approx(2.0 * math.sqrt(2) * sigma * math.sqrt(task + 1) * math.sqrt(32))
    assert bool(torch.isfinite(result.head_weight).all()) and tuple(result.head_weight.shape)[1] == 96


def test_the_coordinator_adds_the_noise_the_in_process_engine_adds(tmp_path):
    """Central DP on the coordinator's own path (join, pull, submit, merge): the same head, bit for bit, as the
    in-process engine's run of the same configuration and noise seed, and the same statement in its summary."""
    config = tiny("ridge", settings={"dp": DP})
    runtime = build_runtime(config)
    workers = [runtime.worker(i, f"c{i}") for i in range(config.num_clients)]
    coord = Coordinator(config, tmp_path / "state")
    for i in range(config.num_clients):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", runtime.spec)
    while coord.run.state == State.RUNNING:
        for i, worker in enumerate(workers):
            plan = coord.pull(f"c{i}")
            if not isinstance(plan, RoundPlan):
                continue
            result = worker.handle(plan)
            key = f"{plan.task}/{plan.round}/{plan.phase.value}/{i}"
            coord.report_eval(result, key) if isinstance(result, EvalReport) else coord.submit(result, key)
    engine = run_inprocess(config)
    assert torch.equal(coord.run.strategy.head_w, engine.head_weight)
    assert coord.run.summary()["privacy"] == engine.summary()["privacy"]


def test_central_noise_on_a_securely_aggregated_sum_gives_the_plain_sums_head():
    """With secure aggregation the coordinator noises the unmasked sum: the same head as the plain fold's, within
    the fixed point's rounding (the noise, seeded, is the same draw)."""
    settings = {"dp": DP, "secagg": {"enabled": True}}
    plain, secure = strategy(None, settings=settings), strategy(None, settings=settings)
    for task in range(2):
        plain.begin_task(task)
        secure.begin_task(task)
        plan = plain.configure(task, 0, Phase.FEATURES)
        secure.configure(task, 0, Phase.FEATURES)
        updates = {i: client_update(plan, i, 20 + task, DP["clip"]) for i in range(3)}
        plain_fold, secure_fold = plain.fold(plan), secure.fold(plan)
        folded, masked = plain_fold.aggregator, secure_fold.aggregator
        for update in updates.values():
            folded.fold(update)
        secure_step(masked, SPEC, plain.config, updates, SecAggSettings(enabled=True), 3)
        plain_fold.finish()
        secure_fold.finish()
        assert torch.allclose(plain.head_w, secure.head_w, rtol=1e-6, atol=1e-9)
        assert plain.step_report(plan) == secure.step_report(plan)


def test_the_export_states_the_privacy_of_the_tasks_it_learned(tmp_path):
    """Each task's export and the final one carry, in their card, the guarantee their releases gave (metrics.json's
    statement, so far); a run without a budget states none."""
    run_inprocess(tiny("ridge", settings={"dp": DP}), results_dir=tmp_path / "private")
    final = ModelCard.from_json((tmp_path / "private" / CARD_FILE).read_text())
    metrics = json.loads((tmp_path / "private" / "metrics.json").read_text())
    assert final.privacy == metrics["privacy"] and final.privacy["epsilon"] == pytest.approx(1.0, rel=1e-6)
    first = ModelCard.from_json((tmp_path / "private" / "task-0" / CARD_FILE).read_text())
    assert [s["task"] for s in first.privacy["steps"]] == [0] and first.privacy["mode"] == "central"
    assert ModelCard.from_json(first.to_json()) == first
    run_inprocess(tiny("ridge"), results_dir=tmp_path / "plain")
    assert ModelCard.from_json((tmp_path / "plain" / CARD_FILE).read_text()).privacy == {}


@pytest.mark.parametrize("views", [1, 2, 5])
def test_a_records_share_with_dropout_views_stays_within_the_sensitivity(views):
    """``ridge.views``: a record's clean features and its views, each clipped to ``C``, enter the sums at weight
    ``1 / (1 + V)``, so removing the record moves its class sum by at most ``C`` and the Gram (Frobenius) by at most
    ``C^2``: the calibration of one row per record holds (:func:`common.privacy.gaussian.calibrate`)."""
    from client.features import sums
    from common.privacy.gaussian import clip_rows

    gen = torch.Generator().manual_seed(views)
    clip, n, width = 2.0, 9, 7
    for trial in range(20):
        x = clip_rows(torch.randn(n, width, generator=gen, dtype=torch.float64) * 5, clip)
        dropped = [
            clip_rows(x + torch.randn(n, width, generator=gen, dtype=torch.float64) * 3, clip) for _ in range(views)
        ]
        y = torch.randint(0, 3, (n,), generator=gen)
        every = sums(x, y, (0, 3), True, views=dropped)
        rest = sums(x[1:], y[1:], (0, 3), True, views=[v[1:] for v in dropped])
        moved = (every["class_sum"] - rest["class_sum"]).norm()
        gram = every["gram_factor"].T @ every["gram_factor"] - rest["gram_factor"].T @ rest["gram_factor"]
        eps = torch.finfo(torch.float64).eps * 64
        assert float(moved) <= clip * (1 + eps), trial
        assert float(gram.norm()) <= clip**2 * (1 + eps), trial
        assert every["class_count"].sum() - rest["class_count"].sum() == 1  # the record counts once


def test_a_private_run_with_dropout_views_passes_the_coordinators_clip_check():
    """A budgeted ridge with views: every client's statistics pass :func:`check_clipped` (the engine's fold raises
    ``UpdateRejected`` otherwise) and the views moved the head (a run without them gives another)."""
    ridge = {"views": 2, "rp_dim": 24}
    viewed = run_inprocess(tiny("ridge", settings={"ridge": ridge, "dp": DP}))
    clean = run_inprocess(tiny("ridge", settings={"ridge": {"rp_dim": 24}, "dp": DP}))
    assert [h["phase"] for h in viewed.history] == ["features", "evaluate"] * 2
    assert not torch.equal(viewed.head_weight, clean.head_weight)
