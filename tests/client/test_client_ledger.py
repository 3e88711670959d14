"""A client's own privacy ledger against a hostile coordinator: it counts what the client computes, not what a plan
says about itself; it cannot be asked for more releases than the client's noise is calibrated for, nor for fresh
noise on a step it already has, nor for anything un-noised; the account is the client's data's, across restarts and
runs; and a secure sum over the same inputs is never given twice."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

from client.classifier import build_model, model_spec
from client.ledger import ClientLedger
from client.ledger_file import LedgerRefused, data_digest, inputs_digest
from client.plans import PlanRefused
from client.runtime import build_runtime
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from common.wire.instructions import GramKind, LoraStep, TrainInstruction
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from common.wire.tensors import GRAM, HEAD_GRAM
from server.steps import open_step
from server.strategies import make_strategy

from exports import OWN_TEXT, own_text_config
from updates import plan_update

BUDGET = {"epsilon": 4.0, "mode": "local", "seed": 3, "sample_rate": 0.25}
DATA = data_digest(own_text_config(), str(OWN_TEXT / "train.csv"))


def private(method: str = "lorm", **changes: object) -> RunConfig:
    base = own_text_config()
    return own_text_config(method=method, settings=base.settings | {"dp": BUDGET}, **changes)


def plans(config: RunConfig, task: int = 0) -> list[RoundPlan]:
    """Task ``task``'s plans as an honest coordinator opens them (LoRM: two rounds, then the Gram step)."""
    strategy = make_strategy(config, model_spec(build_model(config, 6)))
    steps = len(strategy.steps(0))
    return [open_step(strategy, config.rounds_per_task, t, i).plan for t in range(task + 1) for i in range(steps)][
        -steps:
    ]


def without_grams(plan: RoundPlan) -> RoundPlan:
    step = plan.expect(TrainInstruction)
    return dataclasses.replace(plan, instruction=dataclasses.replace(step, gram=GramKind.NONE, head_gram=False))


def relabelled(plan: RoundPlan, **changes: object) -> RoundPlan:
    """``plan`` under the FEATURES label (or other labels), its instruction asking for every Gram."""
    step = dataclasses.replace(plan.expect(LoraStep), gram=GramKind.FULL, head_gram=True)
    return dataclasses.replace(plan, **({"phase": Phase.FEATURES, "instruction": step} | changes))


class Counting:
    """A client half's computation, counted: what the ledger lets through."""

    def __init__(self) -> None:
        self.calls = 0

    def __call__(self, plan: RoundPlan, **parts: object) -> ClientUpdate:
        self.calls += 1
        return plan_update(plan, 0, 4, **parts)


def test_a_replayed_round_beyond_the_plan_is_refused_by_the_worker_before_it_trains():
    """The real worker: after task 0's two rounds, a coordinator asking round 0 again (fresh noise on the same
    records, to average away) is refused, and the same step asked twice in a row gets the update already sent."""
    config = private()
    worker = build_runtime(config).worker(0, "c0")
    first, second, _ = plans(config)
    sent = worker.handle(first)
    assert worker.handle(first) is sent  # asked again at once: the same message, no new noise
    worker.handle(second)
    assert worker.ledger is not None and worker.ledger.entry.released == {0: (2, 2)}
    with pytest.raises(BudgetExceeded, match="task 0's records through 3 rounds"):
        worker.handle(first)
    assert worker.ledger.entry.released == {0: (2, 2)}  # nothing counted: nothing was computed or sent


def test_a_relabelled_gram_step_is_refused_by_its_pair_and_counted_as_a_gram_release_by_what_it_computes():
    """The relabelling attack: FedAvg-LoRA's clients calibrate for training alone (no Gram noise); a LoRA step sent
    as FEATURES asking for every Gram would run the Gram pass un-noised. The worker refuses the pair, which
    FedAvg-LoRA never plans, before it reads a record; and the ledger on its own counts the step by what it
    computes (a Gram release, which this plan has no room for). LoRM's spent Gram budget is not refilled by the
    FEATURES label either."""
    fedavg = private("fedavg-lora")
    worker = build_runtime(fedavg).worker(0, "c0")
    attack = relabelled(plans(fedavg)[0])
    with pytest.raises(PlanRefused, match="phase 'features' with a 'lora' instruction, which method fedavg-lora"):
        worker.handle(attack)
    count = Counting()
    with pytest.raises(BudgetExceeded, match="asks for a Gram release.*fedavg-lora has none"):
        ClientLedger(fedavg).release(attack, lambda: count(attack))
    assert count.calls == 0

    lorm = private()
    ledger = ClientLedger(lorm)
    for plan in plans(lorm):
        ledger.release(plan, lambda plan=plan: count(plan))
    assert ledger.entry.released == {0: (2, 3)}  # the plan's rounds and Gram releases, all spent
    for copy in (relabelled(plans(lorm)[2], round=7), dataclasses.replace(plans(lorm)[2], phase=Phase.FEATURES)):
        with pytest.raises(BudgetExceeded, match="through 2 rounds and 4 Gram releases"):
            ledger.release(copy, lambda copy=copy: count(copy))
    assert count.calls == 3


def test_nothing_leaves_a_private_client_un_noised():
    """The last check on the update: a Gram with no counted Gram release, trained weights with no counted round, a
    head other than the plan's without training, or a kind local mode never noises (a Fisher) is refused."""
    config = private("fedavg-lora")
    first = plans(config)[0]
    gram = {"layer": torch.ones(3)}
    for name, update in [
        (f"{GRAM}/layer", lambda: Counting()(first, grams=gram)),
        (HEAD_GRAM, lambda: Counting()(first, head_gram=torch.eye(2))),
        ("fisher/w", lambda: Counting()(first, fisher={"w": torch.ones(2)})),
    ]:
        with pytest.raises(BudgetExceeded, match=f"would carry {name} without noise"):
            ClientLedger(config).release(first, update)
    evaluation = dataclasses.replace(plans(private())[2], phase=Phase.TASK_GRAM, instruction=LoraStep())
    with pytest.raises(BudgetExceeded, match="head/weight without noise"):  # no round counted: the head must be given
        ClientLedger(private()).release(evaluation, lambda: Counting()(evaluation, head_weight=torch.ones(2, 2)))


def test_the_noise_follows_the_method_not_the_first_instruction():
    """A coordinator that says the first round sends no Grams does not get LoRM's clients calibrated for training
    alone: the plan is the method's (LoRM has a Gram step), and so is its Gram budget."""
    config = private()
    first, second, gram_step = plans(config)
    ledger = ClientLedger(config)
    count = Counting()
    ledger.release(without_grams(first), lambda: count(first))
    assert ledger.noise(first).grams == config.rounds_per_task + 1 and ledger.noise(first).gram_multiplier > 0
    ledger.release(gram_step, lambda: count(gram_step))
    assert ledger.entry.released == {0: (1, 1)}


def test_the_account_survives_a_restart_and_is_the_datas_not_the_run_ids(tmp_path):
    """Restarted, the client still counts what it released; the same configuration under a new run id is the same
    entry (no reset); another configuration on the same records is another run, which the lifetime budget refuses
    once the first has spent; another site's file is refused; an unreadable file is refused."""
    config = private()
    first, second, gram_step = plans(config)
    path = tmp_path / "ledger.json"
    before = ClientLedger(config, path, DATA)
    count = Counting()
    for plan in (first, second):
        before.release(plan, lambda plan=plan: count(plan))
    assert json.loads(path.read_text())["runs"][before.key]["released"] == {"0": [2, 2]}
    renamed = config.replace(run_id="another")
    after = ClientLedger(renamed, path, DATA)  # restarted under a new id: the update it sent is gone, the count is not
    after.admit()
    with pytest.raises(BudgetExceeded, match="3 rounds"):
        after.release(dataclasses.replace(second, run_id="another"), lambda: count(second))
    after.release(gram_step, lambda: count(gram_step))  # the task's Gram step is still within the plan
    assert count.calls == 3 and after.epsilon_spent() == pytest.approx(4.0, abs=4e-3)

    other_run = private(seed=7)  # the same records in another run
    fresh = ClientLedger(other_run, path, DATA)
    with pytest.raises(LedgerRefused, match=r"spent epsilon 4.* in other runs \(another\).*lifetime budget of 4"):
        fresh.admit()
    fresh.admit(lifetime_epsilon=8.5)  # the site's operator allows two runs
    with pytest.raises(LedgerRefused, match="account of other data"):
        ClientLedger(config, path, "own-" + "0" * 64)
    path.write_text("{not json")
    with pytest.raises(LedgerRefused, match="unreadable"):
        ClientLedger(config, path, DATA)


def test_the_same_run_with_its_tasks_cut_otherwise_is_refused(tmp_path):
    """The same configuration with another class order would count old task 1's records as unspent task 0."""
    config = private()
    path = tmp_path / "ledger.json"
    ledger = ClientLedger(config, path, DATA)
    first = plans(config)[0]
    ledger.release(first, lambda: Counting()(first), "alarm,balance")
    again = ClientLedger(config, path, DATA)
    with pytest.raises(LedgerRefused, match=r"task 0 now holds other classes \(greeting,music\)"):
        again.release(plans(config)[1], lambda: Counting()(first), "greeting,music")


def test_a_run_without_a_budget_or_secure_aggregation_has_no_ledger_and_evaluations_pass():
    assert ClientLedger.of(own_text_config()) is None  # no budget, no secure aggregation
    assert ClientLedger.of(private()) is not None
    assert ClientLedger.of(own_text_config(settings=own_text_config().settings | {"secagg": {"enabled": True}}))
    ledger = ClientLedger(private())
    evaluation = dataclasses.replace(plans(private())[0], phase=Phase.EVALUATE, instruction=LoraStep())
    count = Counting()
    for _ in range(3):
        ledger.release(evaluation, lambda: count(evaluation))
    assert count.calls == 3 and not ledger.entry.released


def test_a_secure_sum_over_the_same_inputs_is_given_once_whatever_its_labels(tmp_path):
    """The differencing attack: the coordinator unmasks a session's sum, then serves the same inputs again (another
    round label, another phase label, after the run moved on, in another run) and subtracts, or under distributed DP
    averages two noises. Once the client has seen an unmask request counting it, those inputs are masked for nobody
    again, also after a restart of the client; the session written down may go on; other inputs are other steps.
    In the honest mode without a budget, the protocol's restart of the step just answered (a culprit named) may still
    mask them; never in the signed mode, against a coordinator that deviates."""
    distributed = own_text_config(
        method="ridge",
        settings=own_text_config().settings
        | {"dp": {"epsilon": 1.0, "mode": "distributed"}, "secagg": {"enabled": True}},
    )
    strategy = make_strategy(distributed, model_spec(build_model(distributed, 6)))
    plan = open_step(strategy, distributed.rounds_per_task, 0, 0).plan
    copies = [
        dataclasses.replace(plan, secure_attempt=1),
        dataclasses.replace(plan, round=5),
        dataclasses.replace(plan, phase=Phase.TASK_GRAM, seed=plan.seed + 1),
    ]
    assert {inputs_digest(c) for c in copies} == {inputs_digest(plan)}
    path = tmp_path / "ledger.json"
    ledger = ClientLedger.of(distributed, path, DATA)
    assert ledger is not None and all(ledger.may_mask(p) for p in [plan, *copies])  # nothing unmasked yet
    ledger.unmasking(plan)
    assert ledger.may_mask(plan) and not any(ledger.may_mask(c) for c in copies)
    assert ledger.epsilon_spent() == 1.0
    restarted = ClientLedger(distributed.replace(run_id="again"), path, DATA)
    assert not restarted.may_mask(copies[0])
    later = open_step(strategy, distributed.rounds_per_task, 1, 0).plan
    assert ledger.may_mask(dataclasses.replace(later, secure_attempt=3))  # another step: its own sessions

    secure = own_text_config(settings=own_text_config().settings | {"secagg": {"enabled": True}})
    plain = ClientLedger.of(secure)  # no budget: the same rule against differencing, but for the protocol's restart
    first, second, _ = plans(secure)
    assert plain is not None
    plain.unmasking(first)
    assert plain.may_mask(dataclasses.replace(first, secure_attempt=1))  # the step's restart after a named culprit
    assert not plain.may_mask(dataclasses.replace(first, round=5, secure_attempt=1))  # the same inputs relabelled
    assert not plain.may_mask(dataclasses.replace(first, phase=Phase.TASK_GRAM))
    plain.unmasking(second)  # the run moved on: the first step's inputs are not masked again, in any session
    assert not plain.may_mask(dataclasses.replace(first, secure_attempt=2))
    assert not ledger.may_mask(dataclasses.replace(plan, secure_attempt=2))  # distributed DP: no restart either
    signed = own_text_config(settings=own_text_config().settings | {"secagg": {"enabled": True, "mode": "signed"}})
    against_a_deviating_coordinator = ClientLedger.of(signed)
    assert against_a_deviating_coordinator is not None
    # It could name anyone and restart without its victim: the restart is masked, but answered only for the first
    # session's survivors less the clients proven to deviate (client/secure.py), which the ledger remembers
    first = plans(signed)[0]
    assert against_a_deviating_coordinator.restart_survivors(dataclasses.replace(first, secure_attempt=1)) is None
    against_a_deviating_coordinator.unmasking(first, [3, 0, 2])
    restart = dataclasses.replace(first, secure_attempt=1)
    assert against_a_deviating_coordinator.may_mask(restart)
    assert against_a_deviating_coordinator.restart_survivors(restart) == [0, 2, 3]
    assert against_a_deviating_coordinator.restart_survivors(first) is None  # the answered session itself: a retry
    assert not against_a_deviating_coordinator.may_mask(dataclasses.replace(first, round=5, secure_attempt=1))
    assert plain.restart_survivors(dataclasses.replace(second, secure_attempt=1)) is None  # the honest mode


def test_only_the_sites_operator_resets_the_account(tmp_path, capsys):
    """``lorm-ledger show`` names each run and what it spent; ``reset`` needs ``--yes`` and keeps a copy; after it, a
    new run on the same records is admitted again."""
    from client.ledger_cli import main

    path = tmp_path / "ledger.json"
    spent = ClientLedger(private(), path, DATA)
    first = plans(private())[0]
    spent.release(first, lambda: Counting()(first))
    assert main(["show", str(path)]) == 0
    out = capsys.readouterr().out
    assert "run own-text: budget epsilon 4, delta 1e-05 (local); spent epsilon" in out and "task 0: 1 rounds" in out
    with pytest.raises(LedgerRefused, match="lifetime budget"):
        ClientLedger(private(seed=9), path, DATA).admit()
    assert main(["reset", str(path)]) == 2 and path.exists()
    assert main(["reset", str(path), "--yes"]) == 0 and not path.exists()
    assert len(list(tmp_path.glob("ledger.json.*.bak"))) == 1
    ClientLedger(private(seed=9), path, DATA).admit()
