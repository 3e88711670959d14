"""Client-level DP of the plain-averaging methods (dp.mode = client, DP-FedAvg): a client's whole data set is the unit.
Attacks first: a client that inflates its change or its sample count moves the merge by at most the clip over the
clients folded; then the noise equals the calibration, the budget is spent exactly by the last round and a round
beyond it is refused (also after a restart); the configurations it cannot protect are refused by name."""

from __future__ import annotations

import json
import math

import dp_accounting
import pytest
import torch

from client.classifier import build_model, model_spec
from common.methods.checks import validate
from common.privacy.client_level import ClientLevelNoise, clipped_change, run_rounds
from common.privacy.gaussian import gaussian_mu
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import DELTA, FACTOR, HEAD_BIAS, HEAD_WEIGHT, LORA
from engine.simulation import run_inprocess
from server.steps import merge, open_step
from server.strategies import make_strategy
from server.strategies.private import ClientLevelPrivacy

from exports import own_text_config
from tolerance import rel_tolerance
from updates import plan_update

CLIP = 0.5
BUDGET = {"epsilon": 4.0, "mode": "client", "seed": 3, "clip": CLIP}


def private(method: str = "fedavg-lora", **dp: object) -> RunConfig:
    base = own_text_config()
    return own_text_config(method=method, settings=base.settings | {"dp": BUDGET | dp})


def trained(plan: RoundPlan, index: int, shift: float, samples: int = 4) -> ClientUpdate:
    """A client's answer to ``plan``: the plan's factors and head moved by ``shift`` everywhere (the head's task rows
    only, as training moves them)."""
    lo, hi = plan.class_range
    head = {name: plan.tensors[name].clone() for name in (HEAD_WEIGHT, HEAD_BIAS)}
    for t in head.values():
        t[lo:hi] += shift
    factors = {name: {"B": f.b + shift, "A": f.a + shift} for name, f in plan.low_rank(LORA).items()}
    return plan_update(
        plan, index, samples, train_loss=0.5, head_weight=head[HEAD_WEIGHT], head_bias=head[HEAD_BIAS], factors=factors
    )


def merged(config: RunConfig, updates) -> dict[str, torch.Tensor]:
    """The strategy's factors and head after task 0's first round merges ``updates(plan)`` (the step runner's merge)."""
    strategy = make_strategy(config, model_spec(build_model(config, 6)))
    step = open_step(strategy, config.rounds_per_task, 0, 0)
    assert step.aggregator is not None
    for update in updates(step.plan):
        step.aggregator.fold(update)
    merge(strategy, step, step.aggregator.count, {})
    out = {f"{n}/{p}": t for n, f in strategy.shared.items() for p, t in (("B", f.b), ("A", f.a))}
    return out | {"head": strategy.head_w, "bias": strategy.head_b}


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return math.sqrt(sum(float((a[k] - b[k]).square().sum()) for k in a))


def test_a_client_inflating_its_change_or_its_sample_count_moves_the_merge_by_at_most_the_clip_over_n():
    """Three clients; the third sends a change 10,000 times an honest one's, or claims 10^6 samples. With the same
    noise the merges differ by at most 2 S / 3 (its clipped change against the honest one's, each within S), and the
    sample count weighs nothing. Without the clip (dp off) the same client drags the merge far away."""
    config = private()
    honest = merged(config, lambda p: [trained(p, i, 1e-3) for i in range(3)])
    inflated = merged(config, lambda p: [trained(p, 0, 1e-3), trained(p, 1, 1e-3), trained(p, 2, 10.0)])
    weighty = merged(config, lambda p: [trained(p, 0, 1e-3), trained(p, 1, 1e-3), trained(p, 2, 1e-3, 10**6)])
    slack = 1 + rel_tolerance(torch.float64)
    assert distance(inflated, honest) <= 2 * CLIP / 3 * slack
    assert distance(weighty, honest) <= rel_tolerance(torch.float32) * 10  # the count changes nothing
    open_run = own_text_config(method="fedavg-lora")
    plain = merged(open_run, lambda p: [trained(p, i, 1e-3) for i in range(3)])
    dragged = merged(open_run, lambda p: [trained(p, 0, 1e-3), trained(p, 1, 1e-3), trained(p, 2, 10.0)])
    assert distance(dragged, plain) > 100 * CLIP


def test_a_change_of_any_norm_is_clipped_to_the_bound_and_rows_no_client_trains_keep_the_reference():
    generator = torch.Generator().manual_seed(0)
    reference = {f"{LORA}/q/B": torch.zeros(4, 2), HEAD_WEIGHT: torch.ones(6, 3), HEAD_BIAS: torch.zeros(6)}
    for scale in (1e-3, 1.0, 1e6):
        tensors = {
            f"{FACTOR}/q/B": scale * torch.randn(4, 2, generator=generator),
            HEAD_WEIGHT: 1 + scale * torch.randn(6, 3, generator=generator),
            HEAD_BIAS: scale * torch.randn(6, generator=generator),
        }
        change = clipped_change(tensors, reference, CLIP, (2, 4))
        norm = math.sqrt(sum(float(d.square().sum()) for d in change.values()))
        assert norm <= CLIP * (1 + rel_tolerance(torch.float64))
        assert float(change[HEAD_WEIGHT][:2].abs().max()) == 0 and float(change[HEAD_WEIGHT][4:].abs().max()) == 0
        if scale == 1e-3:  # within the bound: the change itself, from the factor's lora/ reference
            torch.testing.assert_close(change[f"{FACTOR}/q/B"], tensors[f"{FACTOR}/q/B"].double())
    # FedAvg's dense delta/ is a change already: the plan's delta/ of the same name (the global delta) is no reference
    step = {f"{DELTA}/w": torch.full((3,), 0.1)}
    change = clipped_change(step, {f"{DELTA}/w": torch.full((3,), 7.0)}, CLIP, (0, 2))
    torch.testing.assert_close(change[f"{DELTA}/w"], step[f"{DELTA}/w"].double())


def test_the_noise_is_the_calibration_and_the_budget_is_spent_exactly_by_the_last_round():
    """z = 2 sqrt(R) / mu(epsilon, delta) (replace-one: one client's data replaced moves the clipped sum by 2 S); R
    rounds of the Gaussian mechanism of multiplier z, composed by dp_accounting's PLD accountant under replace-one
    (independent of the analytic formula), spend epsilon; the merged mean's noise has deviation z S / n (measured on
    the head's task rows and the factors of a round of identical clients)."""
    config = private()
    dp = config.section(DpSettings)
    rounds = run_rounds(config)
    noise = ClientLevelNoise.of(dp, rounds)
    assert noise.noise_multiplier == pytest.approx(2 * math.sqrt(rounds) / gaussian_mu(dp.epsilon, dp.delta))
    accountant = dp_accounting.pld.PLDAccountant(dp_accounting.NeighboringRelation.REPLACE_ONE)
    accountant.compose(dp_accounting.GaussianDpEvent(noise.noise_multiplier), rounds)
    assert accountant.get_epsilon(dp.delta) == pytest.approx(dp.epsilon, rel=1e-2)
    assert noise.epsilon(rounds, dp.delta) == pytest.approx(dp.epsilon, rel=1e-9)

    big = private(clip=1e3)  # a noise large against float32's rounding of the plan
    same = merged(big, lambda p: [trained(p, i, 0.0) for i in range(3)])
    exact = merged(own_text_config(method="fedavg-lora"), lambda p: [trained(p, i, 0.0) for i in range(3)])
    drawn = torch.cat([(same[k] - exact[k]).flatten() for k in same if k not in ("head", "bias")])
    want = ClientLevelNoise.of(big.section(DpSettings), rounds).noise_multiplier * 1e3 / 3
    assert abs(float(drawn.std()) / want - 1) < 5 / math.sqrt(2 * drawn.numel())  # 5 sd of the sample deviation
    hi = 2  # task 0 holds classes [0, 2)
    assert torch.equal(same["head"][hi:], exact["head"][hi:])  # other tasks' rows: the reference, no noise


def test_a_private_run_states_its_epsilon_after_every_round_and_a_round_beyond_the_plan_is_refused(tmp_path):
    config = private()
    run_inprocess(config, results_dir=tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    rounds = [h for h in metrics["history"] if h["phase"] == "train"]
    spent = [h["dp_epsilon"] for h in rounds]
    assert len(spent) == run_rounds(config) and spent == sorted(spent)
    assert spent[-1] == pytest.approx(4.0, rel=1e-9) and all(h["loss"] is None for h in rounds)
    assert metrics["privacy"]["mode"] == "client" and metrics["privacy"]["unit"] == "client"
    assert json.loads((tmp_path / "model.json").read_text())["privacy"]["epsilon"] == metrics["privacy"]["epsilon"]

    strategy = make_strategy(config, model_spec(build_model(config, 6)))
    account = strategy.privacy
    assert isinstance(account, ClientLevelPrivacy)
    for task in range(config.num_tasks):
        for index in range(config.rounds_per_task):
            account.spend(open_step(strategy, config.rounds_per_task, task, index).plan)
    restarted = make_strategy(config, strategy.spec)
    restarted.load_state_tensors(strategy.state_tensors())
    for s in (strategy, restarted):
        with pytest.raises(BudgetExceeded, match="round 7; their noise is calibrated for 6"):
            open_step(s, config.rounds_per_task, 0, 0)


@pytest.mark.parametrize(
    ("changes", "named"),
    [
        ({"method": "lorm"}, "covers the plain-averaging methods"),
        ({"secagg": {"enabled": True}}, "must see the updates"),
        ({"robust": {"enabled": True}}, "the clip is the bound on a client's weight"),
        ({"data": {"owned": True, "open": True, "train_file": "", "test_file": ""}}, "schedule must be fixed"),
    ],
)
def test_the_runs_client_level_dp_cannot_protect_are_refused_by_name(changes, named):
    config = private()
    settings = {**config.settings}
    for section, values in changes.items():
        if section == "method":
            continue
        settings[section] = {**settings.get(section, {}), **values}
    with pytest.raises(ValueError, match=named):
        validate(config.replace(method=changes.get("method", config.method), settings=settings))
