"""The in-process engine cut short and run again on its state directory: the uninterrupted run, bit for bit;
and one state directory taken on by either driver (the engine or the coordinator) from the other.

A run is stopped by an exception that stands for SIGKILL (a ``BaseException``: nothing catches it)
raised inside a client's step, so the step in progress is lost and only what was committed before
it survives; then the same call on the same state directory finishes the run."""

from __future__ import annotations

import json
import os

import pytest
import torch
from safetensors.torch import load_file
from test_engine import TINY

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from engine.simulation import run_inprocess, saved_config
from lab.cells import Cell, run_cell
from server.coordinator import Coordinator
from server.run_state import SCHEMA, State
from server.state_lock import StateDirHeld, hold
from server.store import Store


class Killed(BaseException):
    """Stands for SIGKILL: nothing after it runs."""


def killed_after(calls: int):
    """A ``wrap`` for the engine whose clients together handle ``calls`` plans, then the process dies."""
    count = [0]

    class Dies:
        def __init__(self, worker) -> None:
            self.worker = worker

        def handle(self, plan):
            count[0] += 1
            if count[0] > calls:
                raise Killed()
            return self.worker.handle(plan)

    return lambda i, worker: Dies(worker)


def config(strategy: str, **kw) -> RunConfig:
    return RunConfig(**{**TINY, "method": strategy, "num_tasks": 2, "rounds_per_task": 2, "local_epochs": 1, **kw})


def same_run(a, b) -> None:
    assert a.matrix.correct == b.matrix.correct and a.matrix.total == b.matrix.total
    # losses, bytes and merge choices of every step (a float64 prints exactly: repr round-trips)
    assert json.dumps(a.history, sort_keys=True) == json.dumps(b.history, sort_keys=True)
    assert set(a.adapter) == set(b.adapter)
    for name in a.adapter:
        assert torch.equal(a.adapter[name].b, b.adapter[name].b) and torch.equal(a.adapter[name].a, b.adapter[name].a)
    assert torch.equal(a.head_weight, b.head_weight) and torch.equal(a.head_bias, b.head_bias)


# Each method's state is of another kind: LoRM's low-rank factors and task Grams, FedAvg's dense delta,
# EWC's anchor and merged Fisher, CCVR's class statistics from a features step, L2P's prompt pool.
# 3 clients, so a step is 3 calls; a task is 2 training steps (then a task Gram, Fisher or features step
# for lorm, ewc, ccvr) and an evaluation. The kill lands inside a training step (lorm 7: task 0's third
# step; fedavg 4: its second), an evaluation (ewc 10, l2p 8), or the second task's first step right
# after the first task's last commit (lorm 12, ccvr 13).
@pytest.mark.parametrize(
    "strategy, calls",
    [("lorm", 7), ("lorm", 12), ("fedavg", 4), ("ewc", 10), ("ccvr", 13), ("l2p", 8)],
)
def test_a_run_cut_short_goes_on_to_the_uninterrupted_result(tmp_path, strategy, calls):
    cfg = config(strategy)
    straight = run_inprocess(cfg, results_dir=tmp_path / "straight")
    with pytest.raises(Killed):
        run_inprocess(cfg, state_dir=tmp_path / "state", wrap=killed_after(calls))
    lines: list[str] = []
    resumed = run_inprocess(cfg, log=lines.append, results_dir=tmp_path / "resumed", state_dir=tmp_path / "state")
    assert lines[0].startswith(f"resumed from {tmp_path / 'state'}: task ")
    assert resumed.resumes == 1 and resumed.summary()["resumes"] == 1 and "resumes" not in straight.summary()
    same_run(straight, resumed)
    for name in ("head.safetensors", "adapter/adapter_model.safetensors"):
        if (tmp_path / "straight" / name).exists():
            got, want = load_file(str(tmp_path / "resumed" / name)), load_file(str(tmp_path / "straight" / name))
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    # a finished run's state, run again, gives the result again without training
    again = run_inprocess(cfg, state_dir=tmp_path / "state", wrap=killed_after(0))
    same_run(straight, again)


def test_a_state_directory_another_run_holds_is_refused_and_freed_when_a_run_ends(tmp_path):
    cfg = config("lorm", num_tasks=1)
    fd = hold(tmp_path)  # another run on this directory: a coordinator, a lorm-sim, a lorm-bench cell
    try:
        with pytest.raises(StateDirHeld, match=f"pid {os.getpid()} on "):
            run_inprocess(cfg, state_dir=tmp_path)
        assert saved_config(tmp_path) is None  # refused before anything was written
    finally:
        os.close(fd)
    with pytest.raises(Killed):  # a run that ends by an exception frees the directory too
        run_inprocess(cfg, state_dir=tmp_path, wrap=killed_after(0))
    os.close(hold(tmp_path))


def test_a_state_directory_of_another_configuration_is_refused(tmp_path):
    cfg = config("lorm", num_tasks=1)
    with pytest.raises(Killed):
        run_inprocess(cfg, state_dir=tmp_path, wrap=killed_after(4))
    assert saved_config(tmp_path) == cfg
    other = config("lorm", num_tasks=1, seed=cfg.seed + 1)
    with pytest.raises(ValueError, match="different configuration"):
        run_inprocess(other, state_dir=tmp_path)


def test_a_grid_cell_cut_short_goes_on_and_leaves_no_state(tmp_path, monkeypatch):
    """``lorm-bench``'s cell runner: a cut-short in-process cell goes on where it stopped when its
    configuration is unchanged, starts over when it changed, and drops its state once done."""
    import engine.simulation

    cfg = config("lorm", num_tasks=1)
    cell = Cell("lorm", 0.5, cfg.seed, cfg)
    cell_dir = cell.dir(tmp_path)
    real = engine.simulation.run_inprocess
    monkeypatch.setattr("lab.cells.run_inprocess", lambda config, **kw: real(config, wrap=killed_after(5), **kw))
    with pytest.raises(Killed):
        run_cell(cell, tmp_path, "inprocess", 0.0, {})
    assert saved_config(cell_dir / "run" / "state") == cfg
    monkeypatch.setattr("lab.cells.run_inprocess", real)
    metrics = run_cell(cell, tmp_path, "inprocess", 0.0, {})
    assert metrics["resumes"] == 1 and not (cell_dir / "run" / "state").exists()
    assert "resumed from" in (cell_dir / "log.txt").read_text()
    straight = run_inprocess(cfg)
    assert metrics["correct"] == straight.matrix.correct
    # cut short again, then the cell's configuration changes: it starts over, and says nothing of resuming
    monkeypatch.setattr("lab.cells.run_inprocess", lambda config, **kw: real(config, wrap=killed_after(5), **kw))
    (cell_dir / "metrics.json").unlink()
    with pytest.raises(Killed):
        run_cell(cell, tmp_path, "inprocess", 0.0, {})
    monkeypatch.setattr("lab.cells.run_inprocess", real)
    changed = Cell("lorm", 0.5, cfg.seed, config("lorm", num_tasks=1, lr=cfg.lr * 2))
    metrics = run_cell(changed, tmp_path, "inprocess", 0.0, {})
    assert "resumes" not in metrics and "resumed from" not in (cell_dir / "log.txt").read_text()


# ------------------------------------------------------------------ one state directory, either driver


def through_coordinator(cfg: RunConfig, state_dir, plans: int | None = None) -> Coordinator:
    """A real Coordinator on ``state_dir`` driven by real workers in index order, stopped (as if killed:
    what is staged stays) before its clients together handle more than ``plans`` plans."""
    runtime = build_runtime(cfg)
    workers = [runtime.worker(i, f"client-{i}") for i in range(cfg.num_clients)]
    coord = Coordinator(cfg, state_dir, on_event=lambda line: None)
    for i in range(cfg.num_clients):
        coord.join(f"client-{i}", i)
        coord.describe(f"client-{i}", runtime.spec)
    handled = 0
    for _turn in range(100):  # bounded: 2 tasks x 4 steps x 3 clients is 24 turns
        if coord.run.state != State.RUNNING:
            break
        for i, worker in enumerate(workers):
            plan = coord.pull(f"client-{i}")
            if not isinstance(plan, RoundPlan) or plan.phase == Phase.DONE:
                continue
            if handled == plans:
                return coord
            out = worker.handle(plan)
            handled += 1
            key = f"{i}-{plan.task}-{plan.round}-{plan.phase.value}"
            coord.submit(out, key) if isinstance(out, ClientUpdate) else coord.report_eval(out, key)
    assert coord.run.state == State.DONE
    return coord


def same_as_coordinator(run, coord: Coordinator) -> None:
    assert coord.run.strategy is not None
    assert coord.run.matrix.correct == run.matrix.correct and coord.run.matrix.total == run.matrix.total
    assert json.dumps(coord.run.history, sort_keys=True) == json.dumps(run.history, sort_keys=True)
    adapter = coord.run.strategy.adapter()
    assert adapter.keys() == run.adapter.keys()
    for name in adapter:
        assert torch.equal(adapter[name].b, run.adapter[name].b) and torch.equal(adapter[name].a, run.adapter[name].a)
    assert torch.equal(coord.run.strategy.head_w, run.head_weight)
    assert torch.equal(coord.run.strategy.head_b, run.head_bias)


def meta_of(state_dir) -> dict:
    return json.loads((state_dir / (state_dir / "CURRENT").read_text() / "meta.json").read_text())


# The kill lands in task 0's task Gram step (engine: 7 plans), or right after task 0's evaluation, before
# task 1 begins (12); the coordinator stops with task 0's second round part-staged (4), or task 1's
# first step not yet begun (12).
@pytest.mark.parametrize("calls", [7, 12])
def test_a_run_cut_short_in_the_engine_is_finished_by_the_coordinator(tmp_path, calls):
    cfg = config("lorm")
    straight = run_inprocess(cfg)
    with pytest.raises(Killed):
        run_inprocess(cfg, state_dir=tmp_path, wrap=killed_after(calls))
    engine_meta = meta_of(tmp_path)
    coord = through_coordinator(cfg, tmp_path)
    assert coord.run.resumes == 1
    same_as_coordinator(straight, coord)
    assert meta_of(tmp_path).keys() == engine_meta.keys()  # one schema, whoever wrote it
    assert meta_of(tmp_path)["state"] == "done" and engine_meta["state"] == "running"


@pytest.mark.parametrize("plans", [4, 12])
def test_a_run_cut_short_in_the_coordinator_is_finished_by_the_engine(tmp_path, plans):
    cfg = config("lorm")
    straight = run_inprocess(cfg)
    coord = through_coordinator(cfg, tmp_path, plans=plans)
    assert coord.run.state == State.RUNNING
    resumed = run_inprocess(cfg, state_dir=tmp_path)
    assert resumed.resumes == 1
    same_run(straight, resumed)
    assert not (tmp_path / "staging").exists() or not any((tmp_path / "staging").iterdir())  # past: dropped
    assert through_coordinator(cfg, tmp_path).run.state == State.DONE  # and the coordinator sees it done


def test_the_engines_unversioned_meta_goes_on(tmp_path):
    """A state directory the engine wrote before schema 1 (no run state, no model, a pointer past the last
    task once done) resumes as it did."""
    cfg = config("lorm")
    straight = run_inprocess(cfg)
    with pytest.raises(Killed):
        run_inprocess(cfg, state_dir=tmp_path, wrap=killed_after(12))

    def unversioned() -> None:
        store = Store(tmp_path)
        saved = store.latest()
        assert saved is not None
        raw, tensors = saved
        done = raw["state"] == "done"
        old = {k: raw[k] for k in ("config", "pointer", "matrix", "history", "seconds", "resumes")}
        store.commit(old | ({"pointer": [raw["pointer"][0] + 1, 0]} if done else {}), tensors)

    unversioned()
    resumed = run_inprocess(cfg, state_dir=tmp_path)
    assert resumed.resumes == 1
    same_run(straight, resumed)
    assert meta_of(tmp_path)["schema"] == SCHEMA  # written in the current schema
    unversioned()  # a finished run's: given again without training
    same_run(straight, run_inprocess(cfg, state_dir=tmp_path, wrap=killed_after(0)))
