"""The coordinator after a crash at its last step: the export it did not finish is redone."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

import server.results
from common.messages import EvalReport, Phase, RoundPlan
from server.coordinator import Coordinator
from test_coordinator import config, started, update_for


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


def test_restart_redoes_an_export_cut_short(tmp_path, monkeypatch):
    done = started(tmp_path / "ref", cfg={"num_tasks": 1})
    run_to_the_end(done)
    coord = started(tmp_path, cfg={"num_tasks": 1})

    def crash(*args, **kwargs):
        raise Crash()

    monkeypatch.setattr(server.results, "export_head", crash)  # after the adapter, before head and metrics
    with pytest.raises(Crash):
        run_to_the_end(coord)
    results = tmp_path / "state" / "results"
    assert (results / "adapter").is_dir() and not (results / "metrics.json").exists()
    monkeypatch.undo()

    again = Coordinator(config(num_tasks=1), tmp_path / "state")  # as after the crash: same state dir
    assert again.done.is_set()
    assert json.loads((results / "metrics.json").read_text())["correct"] == [[18]]
    ref = tmp_path / "ref" / "state" / "results"
    for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
        got, want = load_file(str(results / name)), load_file(str(ref / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
