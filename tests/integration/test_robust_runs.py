"""The robust mode end to end: a hostile client among honest ones, in-process and through the
coordinator's state machine (updates staged on disk, screened when the step closes), bit for bit."""

from __future__ import annotations

import json

import pytest
import torch

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from engine.attacks import HostileWorker, wrap_hostile
from engine.poisoning import main as poison_main
from engine.simulation import run_inprocess
from server.coordinator import Coordinator, State

CONFIG = dict(
    run_id="robust",
    num_clients=5,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=4,
    extra={"synthetic_classes": 8, "synthetic_train": 30, "synthetic_test": 10},
)
ATTACKER = 1


def config(**robust) -> RunConfig:
    return RunConfig(**CONFIG, settings={"robust": {"enabled": True, **robust}})


def through_coordinator(cfg: RunConfig, attack: str, state_dir) -> tuple[Coordinator, list[dict]]:
    """Drive a real Coordinator (staging, screening at close) with real workers, the attacker hostile."""
    runtime = build_runtime(cfg)
    workers = [runtime.worker(i, f"client-{i}") for i in range(cfg.num_clients)]
    workers[ATTACKER] = HostileWorker(workers[ATTACKER], attack)  # type: ignore[assignment]
    coord = Coordinator(cfg, state_dir, on_event=lambda line: None)
    for i in range(cfg.num_clients):
        coord.join(f"client-{i}", i)
        coord.describe(f"client-{i}", runtime.spec)
    for _turn in range(200):  # bounded: 2 tasks x 4 steps x 5 clients is 40 turns
        if coord.run.state == State.DONE:
            break
        for i, worker in enumerate(workers):
            plan = coord.pull(f"client-{i}")
            if not isinstance(plan, RoundPlan) or plan.phase == Phase.DONE:
                continue
            out = worker.handle(plan)
            key = f"{i}-{plan.task}-{plan.round}-{plan.phase.value}"
            coord.submit(out, key) if isinstance(out, ClientUpdate) else coord.report_eval(out, key)
    assert coord.run.state == State.DONE
    return coord, coord.run.history


@pytest.mark.parametrize("attack", ["scale-grams", "flip-sign", "inflate-samples"])
def test_coordinator_screens_exactly_as_the_engine(tmp_path, attack):
    cfg = config()
    inprocess = run_inprocess(cfg, wrap=wrap_hostile(attack, ATTACKER))
    coord, history = through_coordinator(cfg, attack, tmp_path / "state")
    summary = coord.run.summary()
    assert summary["correct"] == inprocess.matrix.correct and summary["total"] == inprocess.matrix.total
    assert coord.run.strategy is not None
    adapter = coord.run.strategy.adapter()
    assert adapter.keys() == inprocess.adapter.keys()
    for name in adapter:
        assert torch.equal(adapter[name].b, inprocess.adapter[name].b), name
        assert torch.equal(adapter[name].a, inprocess.adapter[name].a), name
    assert torch.equal(coord.run.strategy.head_w, inprocess.head_weight)
    reports = [h["robust"] for h in history if "robust" in h]
    assert reports == [h["robust"] for h in inprocess.history if "robust" in h]
    assert ATTACKER in {i for r in reports for i in r["refused"] + r["clipped"]}  # the guard acted on it
    for r in reports:  # every refusal says why
        assert all(r["clients"][str(i)]["refused"] for i in r["refused"])


def test_the_guard_undoes_most_of_a_gram_attack():
    clean = run_inprocess(RunConfig(**CONFIG)).matrix.faa()
    attacked = run_inprocess(RunConfig(**CONFIG), wrap=wrap_hostile("scale-grams", ATTACKER)).matrix.faa()
    # The bound alone (measured: 48.75 against 45.00 clean and 15.00 attacked). The direction rules are
    # off here: on this tiny random-init model honest clients' directions are noisy enough that they
    # refuse honest updates too (with them: 30.00); on CLINC150 they refuse none (docs/RELIABILITY.md).
    bound_only = config(min_cosine=-1.0, relative_cosine=0.0)
    guarded = run_inprocess(bound_only, wrap=wrap_hostile("scale-grams", ATTACKER)).matrix.faa()
    assert attacked < clean - 10.0, (clean, attacked)  # the attack works unguarded
    assert guarded > attacked + 0.5 * (clean - attacked), (clean, attacked, guarded)


@pytest.mark.slow  # an experiment (the poisoning table's runs); the guard's screening is tested above
def test_lorm_poison_writes_its_table(tmp_path, monkeypatch):
    """The benchmark's command on the tiny preset: every cell's metrics and the table."""
    out = tmp_path / "poison"
    rc = poison_main(["--preset", "tiny", "--attacks", "none,scale-grams", "--attacker", "1", "--out", str(out)])
    assert rc == 0
    table = (out / "results.md").read_text()
    assert table.splitlines()[0].startswith("| attack | FAA, guard off | FAA, guard on |")
    assert "| scale-grams |" in table and "| none |" in table
    m = json.loads((out / "scale-grams" / "on" / "metrics.json").read_text())
    assert m["attack"] == "scale-grams" and m["clipped"]["attacker"] > 0
    assert m["config"]["settings"]["robust"]["enabled"] is True


def test_a_run_the_attack_breaks_is_a_result_with_its_reason(tmp_path, monkeypatch):
    """On CLINC150, unguarded factors scaled by 1e4 wreck the merged model until an honest client's
    update is NaN and refused. Here the scale overflows float32 at once: the attacker's own update
    is refused by validation, the cell records where the run broke down, and the table says so."""
    import engine.attacks

    monkeypatch.setattr(engine.attacks, "FACTOR_SCALE", 1e39)
    argv = ["--preset", "tiny", "--attacks", "scale-factors", "--guards", "off", "--attacker", "1"]
    assert poison_main(argv + ["--out", str(tmp_path)]) == 0
    m = json.loads((tmp_path / "scale-factors" / "off" / "metrics.json").read_text())
    assert m["faa"] is None and "an update was refused" in m["broken"] and "must be finite" in m["broken"]
    text = (tmp_path / "results.md").read_text()
    assert "| scale-factors | broken (1) |" in text and "(1) scale-factors, guard off: the run broke down after" in text
