"""A client's own privacy ledger (dp.mode = local) against a hostile coordinator: it cannot ask a client for more
releases than the client's noise is calibrated for, get fresh noise for a step it already has, nor make the client
calibrate for training alone and then ask for Grams; the account survives the client's restart."""

from __future__ import annotations

import dataclasses
import json

import pytest

from client.backbones import build_model, model_spec
from client.ledger import ClientLedger
from client.runtime import build_runtime
from common.privacy.ledger import BudgetExceeded
from common.privacy.training import training_noise
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.messages import ClientUpdate, GramKind, Phase, RoundPlan, TrainInstruction
from server.steps import open_step
from server.strategies import make_strategy

from exports import own_text_config
from updates import plan_update

BUDGET = {"epsilon": 4.0, "mode": "local", "seed": 3, "sample_rate": 0.25}


def private(method: str = "lorm") -> RunConfig:
    base = own_text_config()
    return own_text_config(method=method, settings=base.settings | {"dp": BUDGET})


def plans(config: RunConfig, task: int = 0) -> list[RoundPlan]:
    """Task ``task``'s plans as an honest coordinator opens them (LoRM: two rounds, then the Gram step)."""
    strategy = make_strategy(config, model_spec(build_model(config, 6)))
    return [open_step(strategy, config.rounds_per_task, t, i).plan for t in range(task + 1) for i in range(3)][-3:]


def without_grams(plan: RoundPlan) -> RoundPlan:
    step = plan.expect(TrainInstruction)
    return dataclasses.replace(plan, instruction=dataclasses.replace(step, gram=GramKind.NONE, head_gram=False))


class Counting:
    """A client half's computation, counted: what the ledger lets through."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, plan: RoundPlan) -> ClientUpdate:
        self.calls += 1
        return plan_update(plan, 0, 4)


def test_a_replayed_round_beyond_the_plan_is_refused_by_the_worker_before_it_trains():
    """The real worker: after task 0's two rounds, a coordinator asking round 0 again (fresh noise on the same
    records, to average away) is refused, and the same step asked twice in a row gets the update already sent."""
    config = private()
    worker = build_runtime(config).worker(0, "c0")
    first, second, _ = plans(config)
    sent = worker.handle(first)
    assert worker.handle(first) is sent  # asked again at once: the same message, no new noise
    worker.handle(second)
    assert worker.ledger is not None and worker.ledger.ledger is not None
    assert worker.ledger.ledger.done[0] == (2, 2)
    with pytest.raises(BudgetExceeded, match="task 0's records through 3 rounds"):
        worker.handle(first)
    assert worker.ledger.ledger.done[0] == (2, 2)  # nothing counted: nothing was computed or sent


def test_the_plan_is_pinned_at_the_first_private_step_whatever_later_instructions_say():
    """A coordinator that says the first round sends no Grams gets noise calibrated for training alone, and then no
    Gram step at all; one that says Grams first gets the Grams' calibration on every later round, even one whose
    instruction says none (its noise stays the larger)."""
    config = private()
    first, second, gram_step = plans(config)
    tricked = ClientLedger(config)
    count = Counting()
    tricked.release(without_grams(first), lambda: count(first))
    with pytest.raises(BudgetExceeded, match="asks for a Gram release.*pinned at its first private step"):
        tricked.release(gram_step, lambda: count(gram_step))
    assert count.calls == 1

    dp = config.section(DpSettings)
    with_grams = training_noise(dp, config.local_epochs, config.rounds_per_task, True)
    alone = training_noise(dp, config.local_epochs, config.rounds_per_task, False)
    assert with_grams.noise_multiplier > alone.noise_multiplier
    honest = ClientLedger(config)
    honest.release(first, lambda: count(first))
    assert honest.noise(without_grams(second)) == with_grams
    assert tricked.noise(second) == alone


def test_the_account_survives_a_restart_and_refuses_another_runs_file(tmp_path):
    config = private()
    first, second, gram_step = plans(config)
    path = tmp_path / "ledger.json"
    before = ClientLedger(config, path)
    count = Counting()
    for plan in (first, second):
        before.release(plan, lambda plan=plan: count(plan))
    assert json.loads(path.read_text())["released"] == {"0": [2, 2]}
    after = ClientLedger(config, path)  # the client restarted: the update it sent is gone, the count is not
    with pytest.raises(BudgetExceeded, match="3 rounds"):
        after.release(second, lambda: count(second))
    after.release(gram_step, lambda: count(gram_step))  # the task's Gram step is still within the plan
    assert count.calls == 3 and after.epsilon_spent() == pytest.approx(4.0, abs=4e-3)
    other = config.replace(run_id="another")
    with pytest.raises(ValueError, match="run 'own-text''s.*not run 'another''s"):
        ClientLedger(other, path)
    path.write_text("{not json")
    with pytest.raises(ValueError, match="unreadable"):
        ClientLedger(config, path)


def test_only_a_privately_trained_run_has_a_ledger_and_steps_that_release_nothing_pass():
    assert ClientLedger.of(own_text_config()) is None  # no budget
    assert ClientLedger.of(private()) is not None
    ledger = ClientLedger(private())
    evaluation = dataclasses.replace(plans(private())[0], phase=Phase.EVALUATE)
    count = Counting()
    for _ in range(3):
        ledger.release(evaluation, lambda: count(evaluation))
    assert count.calls == 3 and ledger.ledger is None


def test_a_distributed_step_whose_sum_may_be_out_gets_no_second_session_with_fresh_noise(tmp_path):
    """The attack on distributed mode: the coordinator unmasks a session's sum, claims the session failed and opens
    another, whose fresh noise shares averaged with the first sum's halve the noise. Once the client has seen the
    unmask request of attempt 0 it may still finish attempt 0, but masks attempt 1 for nobody, also after a restart;
    a session that failed before its unmask request costs nothing, and local mode (each update private on its own,
    masked again unchanged) keeps no such record."""
    distributed = own_text_config(
        method="ridge",
        settings=own_text_config().settings
        | {"dp": {"epsilon": 1.0, "mode": "distributed"}, "secagg": {"enabled": True}},
    )
    strategy = make_strategy(distributed, model_spec(build_model(distributed, 6)))
    plan = open_step(strategy, distributed.rounds_per_task, 0, 0).plan
    again = dataclasses.replace(plan, secure_attempt=1)
    path = tmp_path / "ledger.json"
    ledger = ClientLedger.of(distributed, path)
    assert ledger is not None and ledger.may_mask(plan) and ledger.may_mask(again)  # nothing unmasked yet
    ledger.unmasking(plan)
    assert ledger.may_mask(plan) and not ledger.may_mask(again)
    assert not ClientLedger(distributed, path).may_mask(again)  # restarted: the same answer
    later = open_step(strategy, distributed.rounds_per_task, 1, 0).plan
    assert ledger.may_mask(dataclasses.replace(later, secure_attempt=3))  # another step: its own sessions

    local = ClientLedger(private())
    first = plans(private())[0]
    local.unmasking(first)
    assert local.may_mask(dataclasses.replace(first, secure_attempt=1)) and not local.unmasked
