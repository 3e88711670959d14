"""``lorm-sim`` takes ``lorm-server``'s schedule flags (``--task``, ``--schedule``, ``--open``) with their meaning and
their errors: a run with ``--task`` is the run of the equivalent ``data.classes`` / ``task_sizes`` settings, bit for
bit, and ``--open`` (no operator in one process) ends after the last task with the same adapter and head."""

from __future__ import annotations

import json
import logging

import pytest
import torch
from safetensors.torch import load_file

from common.run.schedule import config_with_schedule
from engine.simulation import build_parser, main
from server.main import build_parser as server_parser
from server.main import main as lorm_server

from own_data import SCHEDULED, disjoint_clients

TINY = [  # tests/own_data.py's owned_config, as flags
    *("--no-progress", "--set", "run_id=owned", "--set", "dataset=textfile", "--set", "backbone=tiny-bert"),
    *("--set", "num_clients=3", "--set", "rounds_per_task=2", "--set", "local_epochs=1", "--set", "rank=2"),
    *("--set", "max_length=16", "--set", "lr=3e-2", "--set", "lr_lora=1e-3", "--set", "threads=1", "--set", "seed=5"),
]
TASKS = ["--task", "alarm,balance", "--task", "greeting,music"]


@pytest.fixture(autouse=True)
def kept_logging(monkeypatch):
    """lorm-sim routes the process's logs to its stdout: put them back after each test."""
    root = logging.getLogger()
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)


def sim_config(*argv: str):
    return config_with_schedule(build_parser().parse_args(list(argv)))


def test_the_schedule_flags_make_the_config_lorm_server_makes():
    argv = [*TINY, *TASKS, "--open", "--set", "data.max_classes=6"]
    server = config_with_schedule(server_parser().parse_args(["--state-dir", "unused", *argv[1:]]))
    assert sim_config(*argv).to_json() == server.to_json()
    data = server.settings["data"]
    assert data == {"owned": True, "classes": SCHEDULED, "open": True, "max_classes": 6}
    assert (server.num_tasks, server.task_sizes) == (2, [2, 2])


def test_a_schedule_file_is_the_same_run_as_its_tasks(tmp_path):
    schedule = tmp_path / "schedule.txt"
    schedule.write_text("# the run's tasks\nalarm, balance\n\ngreeting,music\n")
    assert sim_config(*TINY, "--schedule", str(schedule)).to_json() == sim_config(*TINY, *TASKS).to_json()


@pytest.mark.parametrize(
    ("flags", "error"),
    [
        (["--task", "alarm", "--schedule", "x.txt"], "--schedule FILE and --task A,B,C both give the schedule"),
        (["--task", "alarm,", "--task", "music"], "a task is class names separated by commas, got 'alarm,'"),
        (["--task", "alarm", "--task", "alarm"], "class names must be unique, repeated: ['alarm']"),
        (["--schedule", "no-such-schedule.txt"], "no-such-schedule.txt"),
    ],
)
def test_lorm_sim_refuses_a_bad_schedule_as_lorm_server_does(flags, error, tmp_path, capsys):
    with pytest.raises(SystemExit) as sim:
        main([*TINY, *flags])
    sim_err = capsys.readouterr().err
    with pytest.raises(SystemExit) as server:
        lorm_server([*TINY[1:], *flags, "--state-dir", str(tmp_path / "state"), "--insecure", "--port", "0"])
    server_err = capsys.readouterr().err
    assert sim.value.code == server.value.code == 2
    assert error in sim_err and sim_err.split("error: ")[1] == server_err.split("error: ")[1]


def test_a_schedule_without_the_clients_files_names_the_setting_to_give(capsys):
    assert main([*TINY, *TASKS]) == 2
    err = capsys.readouterr().err
    assert "data.owned (what --task and --schedule set)" in err and "set data.clients_dir=DIR" in err


def test_a_run_with_task_flags_and_open_is_the_run_of_the_equivalent_settings(tmp_path, capsys):
    clients = disjoint_clients(tmp_path / "clients")
    own = ["--set", f"data.clients_dir={clients}"]
    flagged, settings = tmp_path / "flags", tmp_path / "settings"
    assert main([*TINY, *own, *TASKS, "--open", "--results-dir", str(flagged)]) == 0
    assert "lorm-sim: --open: in one process no operator appends tasks" in capsys.readouterr().err
    equivalent = [
        *("--set", "data.owned=true", "--set", f"data.classes={json.dumps(SCHEDULED)}"),
        *("--set", "num_tasks=2", "--set", "task_sizes=[2,2]"),
    ]
    assert main([*TINY, *own, *equivalent, "--results-dir", str(settings)]) == 0

    for name in ("adapter/adapter_model.safetensors", "head.safetensors", "task-0/head.safetensors"):
        want, got = load_file(str(settings / name)), load_file(str(flagged / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    ran, wanted = (json.loads((d / "metrics.json").read_text()) for d in (flagged, settings))
    assert ran["correct"] == wanted["correct"] and ran["total"] == wanted["total"]
    assert ran["config"]["settings"]["data"] == {**wanted["config"]["settings"]["data"], "open": True}
    assert {**ran["config"], "settings": None} == {**wanted["config"], "settings": None}
    assert json.loads((flagged / "model.json").read_text())["classes"] == SCHEDULED
