"""A hostile coordinator against a real ``lorm-client`` process (``fake_coordinator.py``: a server on the generated
stubs that sends what it likes and keeps, decoded, what the client sends). The client refuses each attack with the
setting or step named, exits 3 without a traceback, and sends nothing the attack asked for: a one-client "secure"
run, sizes no laptop survives, a shard that does not exist, a relabelled Gram step, plans that do not decode, and a
new run id on records that already spent their lifetime budget."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from fake_coordinator import HostileCoordinator, serve

from client.ledger import ClientLedger
from client.ledger_file import data_digest
from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.instructions import GramKind, LoraStep
from common.wire.messages import Phase, RoundPlan
from proto import codec
from server.steps import open_step
from server.strategies import make_strategy

from procs import ProjectProc as Proc

BASE = dict(run_id="hostile", num_tasks=1, rounds_per_task=1, local_epochs=1, rank=2, threads=1)
PRIVATE = {"dp": {"epsilon": 2.0, "mode": "local", "sample_rate": 0.5}}


def run_client(coordinator: HostileCoordinator, *flags: str) -> tuple[int, str]:
    """A real client process against ``coordinator``: its exit code and output."""
    server, port = serve(coordinator)
    try:
        client = Proc(
            "client-0",
            [sys.executable, "-m", "client.main", "--server", f"127.0.0.1:{port}", "--client-id", "client-0"]
            + ["--give-up", "10", "--insecure", "--no-progress", *flags],
        )
        code = client.wait(timeout=150)
    finally:
        server.stop(0)
    return code, "".join(client.lines)


def first_plan(config: RunConfig) -> RoundPlan:
    """The first step's plan as an honest coordinator would open it for ``config``'s model."""
    strategy = make_strategy(config, build_runtime(config).spec)
    return open_step(strategy, config.rounds_per_task, 0, 0).plan


def raw(plan: RoundPlan, kind: str | None = None, fields: str | None = None) -> list:
    """``plan`` on the wire, its instruction's kind or fields replaced by what no honest coordinator sends."""
    chunks = list(codec.plan_to_proto(plan))
    if kind is not None:
        chunks[0].header.instruction.kind = kind
    if fields is not None:
        chunks[0].header.instruction.fields_json = fields
    return chunks


@pytest.mark.parametrize(
    ("config", "index", "flags", "named"),
    [
        (
            RunConfig(num_clients=1, settings={"secagg": {"enabled": True}}, **BASE),
            0,
            ["--require-secure-aggregation", "--min-clients", "1"],
            "sets num_clients=1, below this client's floor of 3 (a secure run's)",
        ),
        (RunConfig(num_clients=2, max_length=10**6, **BASE), 0, [], "sets max_length=1000000, above this client's cap"),
        (RunConfig(num_clients=2, **BASE | {"local_epochs": 10**7}), 0, [], "sets local_epochs=10000000, above"),
        (RunConfig(num_clients=3, **BASE), 7, [], "the coordinator gave this client index 7 of 3 clients"),
        (RunConfig(num_clients=2, **BASE | {"run_id": "r" * 300}), 0, [], "sets run_id=300, above this client's cap"),
    ],
    ids=["one-client-secure", "max-length", "epochs", "shard-7-of-3", "run-id"],
)
def test_a_configuration_below_the_clients_floor_or_above_its_caps_is_refused_at_join(config, index, flags, named):
    coordinator = HostileCoordinator(config, index=index)
    code, out = run_client(coordinator, *flags)
    assert code == 3 and named in out and "Traceback" not in out, out
    assert coordinator.sent.described == [] and coordinator.sent.pulls == 0  # joined, then nothing


def test_a_relabelled_gram_step_is_refused_and_nothing_leaves_the_client():
    """FedAvg-LoRA's private clients calibrate for training alone: its first round relabelled FEATURES, asking for
    every Gram, would send the Grams of every layer's input un-noised. The client refuses the pair by name before
    it reads a record and pushes nothing."""
    config = RunConfig(method="fedavg-lora", num_clients=2, settings=PRIVATE, **BASE)
    plan = first_plan(config)
    attack = dataclasses.replace(
        plan,
        phase=Phase.FEATURES,
        instruction=dataclasses.replace(plan.expect(LoraStep), gram=GramKind.FULL, head_gram=True),
    )
    coordinator = HostileCoordinator(config, [attack])
    code, out = run_client(coordinator)
    assert code == 3 and "Traceback" not in out, out
    assert "phase 'features' with a 'lora' instruction, which method fedavg-lora never produces" in out
    assert len(coordinator.sent.described) == 1 and coordinator.sent.updates == []


@pytest.mark.parametrize(
    ("kind", "fields", "named"),
    [
        (None, "{not json", "instruction 'lora': not JSON"),
        (None, "[" * 100_000 + "]" * 100_000, "instruction 'lora': "),
        ("no-such-kind", None, "unknown instruction kind 'no-such-kind'"),
        (None, '{"train_factors": ["B"], "view_scale": true}', "view_scale"),
        (None, '{"gram": "diag", "surprise": 1}', "surprise"),
    ],
    ids=["not-json", "nested", "unknown-kind", "bool-for-a-number", "unknown-field"],
)
def test_a_plan_that_does_not_decode_is_a_refusal_not_a_traceback(kind, fields, named):
    config = RunConfig(method="fedavg-lora", num_clients=2, **BASE)
    coordinator = HostileCoordinator(config, [raw(first_plan(config), kind, fields)])
    code, out = run_client(coordinator)
    assert code == 3 and "the coordinator's plan is malformed" in out and named in out, out
    assert "Traceback" not in out and coordinator.sent.updates == []


def test_a_new_run_id_on_records_that_spent_their_budget_is_refused(tmp_path: Path):
    """The client's account is its data's: records that spent epsilon 2 in one run take part in no second run with
    another id and configuration (its budget would add to theirs) until the site's operator says so."""
    earlier = RunConfig(method="lorm", num_clients=2, settings=PRIVATE, **BASE | {"run_id": "first"})
    path = tmp_path / "ledger.json"
    data = data_digest(earlier, "", 0)
    ledger = ClientLedger(earlier, path, data)  # what the first run's client wrote: task 0 through the whole plan
    ledger.noise(first_plan(earlier))
    assert ledger.ledger is not None
    ledger.ledger.spend(0, earlier.rounds_per_task, earlier.rounds_per_task + 1, "the first run's task 0")
    ledger.entry.spent = ledger.epsilon_spent()
    ledger._save()
    later = RunConfig(method="lorm", num_clients=2, settings=PRIVATE, **BASE | {"run_id": "second", "seed": 7})
    coordinator = HostileCoordinator(later, [first_plan(later)])
    code, out = run_client(coordinator, "--privacy-ledger", str(path))
    assert code == 3 and "refusing run second" in out and "over the lifetime budget of 2" in out, out
    assert coordinator.sent.updates == [] and coordinator.sent.pulls == 0
    code, out = run_client(HostileCoordinator(later, []), "--privacy-ledger", str(path), "--lifetime-epsilon", "4.5")
    assert code == 0 and "epsilon 0 spent in this run, 2 in 1 other runs on the same data" in out, out
