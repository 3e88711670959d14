"""The trained methods with a privacy budget (dp.mode = local): a run states what its records spent after every
step, the coordinator refuses a step beyond what the clients' noise is calibrated for (also after a restart), and
the noise is reproducible by its seed only."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from client.classifier import build_model, model_spec
from common.privacy.ledger import BudgetExceeded
from common.run.config import RunConfig
from engine.simulation import run_inprocess
from server.steps import open_step
from server.strategies import make_strategy

from exports import image_config, image_folder, own_text_config

BUDGET = {"epsilon": 4.0, "mode": "local", "seed": 3, "sample_rate": 0.25}


def private(method: str, **dp: object) -> RunConfig:
    base = own_text_config()
    return own_text_config(method=method, settings=base.settings | {"dp": BUDGET | dp})


@pytest.mark.parametrize("method", ["lorm", "fedavg-lora"])
def test_a_private_run_states_each_steps_epsilon_and_spends_the_budget_by_each_tasks_end(method, tmp_path):
    """Within a task the epsilon its records spent grows with every release and reaches the budget at the last one
    the clients calibrated for (LoRM: 2 rounds and 3 Gram releases; FedAvg-LoRA: 2 rounds); each task's records
    start afresh; metrics.json and the export's card state the run's epsilon."""
    config = private(method)
    result = run_inprocess(config, results_dir=tmp_path)
    metrics = json.loads((tmp_path / "metrics.json").read_text())
    released = [h for h in metrics["history"] if "dp" in h]
    per_task = 3 if method == "lorm" else 2
    assert len(released) == per_task * config.num_tasks
    assert all(h["loss"] is None for h in released)  # a private client releases no training loss
    for task in range(config.num_tasks):
        spent = [h["dp_epsilon"] for h in released if h["task"] == task]
        assert spent == sorted(spent) and spent[0] < spent[-1]
        assert abs(spent[-1] - 4.0) <= 4e-3
        assert released[task * per_task]["dp"]["released"]["rounds"] == 1
    last = released[-1]["dp"]
    assert last["mode"] == "local" and last["planned"] == {"rounds": 2, "grams": 3 if method == "lorm" else 0}
    assert abs(metrics["privacy"]["epsilon"] - 4.0) <= 4e-3 and metrics["privacy"]["mode"] == "local"
    card = json.loads((tmp_path / "model.json").read_text())
    assert card["privacy"]["epsilon"] == metrics["privacy"]["epsilon"]
    assert result.matrix.total == metrics["total"]


def test_the_same_seed_gives_the_same_run_and_another_seed_another(tmp_path):
    """DP-SGD's batches come from the step's seed and its noise from dp.seed (the CSPRNG without one)."""
    heads = []
    for name, seed in (("a", 3), ("b", 3), ("c", 4)):
        run_inprocess(private("lorm", seed=seed), results_dir=tmp_path / name)
        heads.append(load_file(str(tmp_path / name / "head.safetensors")))
    assert all(torch.equal(heads[0][k], heads[1][k]) for k in heads[0])
    assert not all(torch.equal(heads[0][k], heads[2][k]) for k in heads[0])


def test_a_step_beyond_the_calibrated_plan_is_refused_also_after_a_restart():
    """A coordinator whose ledger holds task 0's two rounds refuses to open a third training round of task 0 (the
    operator could only get there by re-running a finished round): the clients' noise would no longer cover it.
    The ledger is part of the persisted state, so a restarted coordinator refuses it too."""
    config = private("lorm")
    spec = model_spec(build_model(config, 6))
    strategy = make_strategy(config, spec)
    for index in range(2):
        step = open_step(strategy, config.rounds_per_task, 0, index)
        strategy.privacy.spend(step.plan)  # as the step's merge spends it
    restarted = make_strategy(config, spec)
    restarted.load_state_tensors(strategy.state_tensors())
    for s in (strategy, restarted):
        with pytest.raises(BudgetExceeded, match="task 0's records through 3 rounds.*calibrated for 2"):
            open_step(s, config.rounds_per_task, 0, 0)
        open_step(s, config.rounds_per_task, 0, 2)  # the task's Gram step is still within the plan
        open_step(s, config.rounds_per_task, 1, 0)  # and so is task 1's first round


def test_fedavg_of_a_vits_every_weight_trains_under_dp_sgd(tmp_path):
    """A private FedAvg on a ViT (tiny-vit, an image folder) trains every weight, the patch embedding's convolution,
    the class token and the position embedding included (their per-sample gradients: client/persample.py), and its
    records spend the budget (it was refused at the first training step before)."""
    classes = ["a", "b", "c", "d"]
    image_folder(tmp_path / "images", classes, {"train": 8, "test": 2})
    config = image_config(tmp_path / "images", classes, method="fedavg", settings={"dp": BUDGET | {"sample_rate": 0.5}})
    run_inprocess(config, results_dir=tmp_path / "run")
    delta = load_file(str(tmp_path / "run" / "delta.safetensors"))
    assert {"cls_token", "pos_embed", "patch_embed.proj.weight"} <= set(delta)
    assert [n for n, t in delta.items() if not bool(t.abs().max() > 0)] == []
    metrics = json.loads((tmp_path / "run" / "metrics.json").read_text())
    assert abs(metrics["privacy"]["epsilon"] - 4.0) <= 4e-3
