"""The coordinator after a crash: a cut-short export is redone; a redone step is in TensorBoard once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_coordinator import config, started, update_for

import server.results
from common.wire.messages import EvalReport, Phase, RoundPlan
from server.coordinator import Coordinator
from server.run import Run


class Crash(BaseException):
    """Stands for SIGKILL: nothing after it runs."""


def run_to_the_end(coord: Coordinator) -> None:
    """Every step of a one-task run: train B, train A, task Gram, evaluate (3 clients)."""
    for _ in range(3):
        plan = coord.pull("c0")
        assert isinstance(plan, RoundPlan) and plan.phase in (Phase.TRAIN, Phase.TASK_GRAM), plan
        for i in range(3):
            coord.submit(update_for(plan, i), f"k{plan.round}/{i}")
    assert coord.pull("c0").phase == Phase.EVALUATE
    for i in range(3):
        coord.report_eval(EvalReport("unit", f"c{i}", i, 0, [5 + i], [10]), f"e{i}")


@pytest.mark.parametrize("cut", ["task-0", "results"])
def test_restart_redoes_an_export_cut_short(tmp_path, monkeypatch, cut):
    """``cut``: the export the crash hits, the one after task 0 (written first) or the final one."""
    done = started(tmp_path / "ref", cfg={"num_tasks": 1})
    run_to_the_end(done)
    coord = started(tmp_path, cfg={"num_tasks": 1})
    export_head = server.results.export_head

    def crash(out, *args, **kwargs):
        if Path(out).name == cut:
            raise Crash()
        return export_head(out, *args, **kwargs)

    monkeypatch.setattr(server.results, "export_head", crash)  # after the adapter, before head and metrics
    with pytest.raises(Crash):
        run_to_the_end(coord)
    results = tmp_path / "state" / "results"
    written = results / "task-0" if cut == "task-0" else results
    assert (written / "adapter").is_dir() and not (written / "model.json").exists()
    assert not (results / "metrics.json").exists()
    monkeypatch.undo()

    again = Coordinator(config(num_tasks=1), tmp_path / "state")  # as after the crash: same state dir
    assert again.done.is_set()
    assert json.loads((results / "metrics.json").read_text())["correct"] == [[18]]
    ref = tmp_path / "ref" / "state" / "results"
    for folder in ("", "task-0"):
        assert json.loads((results / folder / "model.json").read_text())["tasks_trained"] == 1
        for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
            got, want = load_file(str(results / folder / name)), load_file(str(ref / folder / name))
            assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), (folder, name)


def scalar_steps(events_dir, tag: str) -> list[int]:
    """Every step recorded for ``tag`` across all event files, as any reader of the raw files sees them."""
    from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

    steps = []
    for path in sorted(events_dir.glob("events.out.tfevents.*")):
        for event in EventFileLoader(str(path)).Load():
            steps += [event.step for v in event.summary.value if v.tag == tag]
    return sorted(steps)


def test_restart_leaves_each_committed_step_in_tensorboard_once(tmp_path, monkeypatch):
    coord = started(tmp_path, cfg={"num_tasks": 1})
    plan = coord.pull("c0")

    def crash(self, keep=None):
        raise Crash()

    monkeypatch.setattr(Run, "commit", crash)  # step 0 reaches the event file, its state never commits
    with pytest.raises(Crash):
        for i in range(3):
            coord.submit(update_for(plan, i), f"k{plan.round}/{i}")
    monkeypatch.undo()
    events = tmp_path / "state" / "results" / "tensorboard"
    assert scalar_steps(events, "loss/train") == [0]

    again = Coordinator(config(num_tasks=1), tmp_path / "state")  # the step is redone
    while (plan := again.pull("c0")).phase != Phase.EVALUATE:
        for i in range(3):
            again.submit(update_for(plan, i), f"k{plan.round}/{i}")
    for i in range(3):
        again.report_eval(EvalReport("unit", f"c{i}", i, 0, [5 + i], [10]), f"e{i}")
    assert again.done.is_set()
    assert scalar_steps(events, "loss/train") == [0, 1, 2]
    assert scalar_steps(events, "accuracy/task0") == [0] and scalar_steps(events, "faa/paper") == [0]
