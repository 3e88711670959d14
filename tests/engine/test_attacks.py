"""The adaptive attacks of engine/attacks.py: what each sends, bounded and deterministic."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch

from common.aggregation.validate import UpdateRejected
from common.run.settings import RobustSettings
from common.wire.tensors import GRAM
from engine.attacks import (
    COLLUDE_SEED,
    DRIFT,
    DRIFT_SEED,
    INFLATE,
    PULL,
    UNDER,
    direction,
    hostile_indices,
    tamper,
    wrap_hostile,
)
from server.robust_measures import CHANGE, SECOND, change, measure, plan_starts, tensor_role
from server.robust_screen import Screen

from tolerance import rel_tolerance

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "server"))
from test_robust import CLIENTS, b_round, honest  # noqa: E402

F32, F64 = torch.float32, torch.float64


def measures(update, plan) -> dict[str, float]:
    starts = plan_starts(plan)
    out = {}
    for name, t in update.tensors.items():
        role = tensor_role(name, t)
        if role in (CHANGE, SECOND):
            out[name] = measure(role, name, t, starts, update.num_samples)
    return out


def cosine(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a * b).sum() / (a.norm() * b.norm()))


def test_inflate_samples_claims_ten_times_its_samples_within_the_runs_cap_with_honest_per_sample_measures():
    plan, strategy = b_round()
    update = honest(plan, 2)
    inflated = tamper("inflate-samples", update, plan)
    assert inflated.num_samples == INFLATE * update.num_samples
    assert tamper("inflate-samples", update, plan, most=100).num_samples == 100  # what the coordinator admits
    before, after = measures(update, plan), measures(inflated, plan)
    for name, value in before.items():  # per claimed sample, nothing moved: the old guard saw an honest client
        assert after[name] == pytest.approx(value, rel=rel_tolerance(F32))
    strategy.aggregator(plan).check(inflated)  # well-formed: validation admits it
    again = tamper("inflate-samples", update, plan)
    assert torch.equal(again.named(GRAM)["l1"], inflated.named(GRAM)["l1"])  # deterministic


def test_scale_under_bound_sits_at_095_kappa_times_its_own_measures_and_passes_a_guard_of_its_peers():
    plan, strategy = b_round()
    update = honest(plan, 3)
    kappa = 2.0
    sent = tamper("scale-under-bound", update, plan, kappa=kappa)
    assert sent.num_samples == math.floor(UNDER * kappa * update.num_samples)
    before, after = measures(update, plan), measures(sent, plan)
    for name, value in before.items():
        assert after[name] == pytest.approx(UNDER * kappa * value, rel=rel_tolerance(F32, terms=64)), name
    for name in ("factor/l1/B", "factor/l2/B"):  # along its honest direction
        starts = plan_starts(plan)
        assert cosine(change(name, sent.tensors[name], starts), change(name, update.tensors[name], starts)) > 1 - 1e-6
    # Among clients like itself (the attacker's estimate of the medians is right), nothing is over a bound.
    updates = [honest(plan, 3, noise=0.0) for _ in range(CLIENTS)]
    for i, u in enumerate(updates):
        u.client_index = i
    updates[3] = tamper("scale-under-bound", updates[3], plan, kappa=kappa)
    screen = Screen(RobustSettings(enabled=True, kappa=kappa), plan)
    for u in updates:
        screen.observe(u)
    verdict = screen.judge(updates[3])
    assert not verdict.refused and not verdict.clipped and UNDER * kappa - 0.01 < verdict.ratio <= UNDER * kappa + 1e-6


def test_slow_drift_keeps_its_norm_and_turns_further_every_update():
    plan, _ = b_round()
    update = honest(plan, 1)
    starts = plan_starts(plan)
    name = "factor/l1/B"
    honest_change = change(name, update.tensors[name], starts)
    cosines = []
    for sent in (1, 5, 10, 20):
        drifted = change(name, tamper("slow-drift", update, plan, sent=sent).tensors[name], starts)
        assert float(drifted.norm()) == pytest.approx(float(honest_change.norm()), rel=rel_tolerance(F32, terms=64))
        cosines.append(cosine(drifted, honest_change))
        # the turn is by DRIFT x sent towards one fixed direction
        u = direction(name, honest_change.shape, DRIFT_SEED)
        mixed = honest_change / honest_change.norm() + DRIFT * sent * u
        assert cosines[-1] == pytest.approx(cosine(mixed, honest_change), abs=1e-5)
    assert cosines == sorted(cosines, reverse=True) and cosines[0] > 0.99 and cosines[-1] < 0.6


def test_colluders_pull_towards_one_shared_direction_and_take_consecutive_clients():
    plan, _ = b_round()
    starts = plan_starts(plan)
    name = "factor/l2/B"
    shape = change(name, honest(plan, 0).tensors[name], starts).shape
    u = direction(name, shape, COLLUDE_SEED)
    for i in (3, 4, 5):
        update = honest(plan, i)
        before = change(name, update.tensors[name], starts)
        after = change(name, tamper("collude-3", update, plan).tensors[name], starts)
        expected = before / before.norm() + PULL * u
        assert cosine(after, expected) > 1 - 1e-5  # the same u for every colluder
        assert cosine(after, u) > cosine(before, u) + 0.3
    assert hostile_indices("collude-2", 3, 10) == [3, 4] and hostile_indices("collude-3", 3, 10) == [3, 4, 5]
    assert hostile_indices("slow-drift", 3, 10) == [3]
    with pytest.raises(ValueError, match=r"takes clients \[8, 9, 10\], but the run has 10"):
        hostile_indices("collude-3", 8, 10)
    wrap = wrap_hostile("collude-2", [3, 4])
    assert [type(wrap(i, object())).__name__ for i in (2, 3, 4, 5)] == [
        "object",
        "HostileWorker",
        "HostileWorker",
        "object",
    ]


def test_an_inflated_claim_past_the_runs_cap_is_refused_by_validation():
    """The cap ``inflate-samples`` keeps under: the coordinator's sample bounds (server/checks.py)."""
    plan, strategy = b_round()
    update = tamper("inflate-samples", honest(plan, 2), plan)
    with pytest.raises(UpdateRejected, match="num_samples"):
        strategy.aggregator(plan).check(update, samples=(1, update.num_samples - 1))
