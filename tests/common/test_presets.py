"""Presets are valid configurations and carry the paper's settings."""

import argparse

import pytest

from common.run.arguments import add_config_arguments, config_from_args
from common.run.config import RunConfig
from common.run.presets import PRESETS


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_every_preset_is_a_valid_config(name):
    RunConfig(**PRESETS[name])


def test_paper_settings_spot_checks():
    oos = RunConfig(**PRESETS["paper-clinc150-b0.2"])
    assert (oos.num_tasks, oos.rank, oos.lr, oos.gamma_head, oos.backbone) == (5, 1, 1e-2, 0.1, "t5-small")
    cars = RunConfig(**PRESETS["paper-cars196-b1.0"])
    assert cars.task_sizes == [20] * 9 + [16] and cars.rounds_per_task == 10 and cars.rank == 8
    cub = RunConfig(**PRESETS["paper-cub200-b0.5"])
    assert (cub.lr, cub.gamma_head, cub.num_clients, cub.local_epochs) == (3e-2, 0.3, 10, 5)


def test_overrides_apply_in_order(tmp_path):
    parser = argparse.ArgumentParser()
    add_config_arguments(parser)
    path = tmp_path / "c.json"
    path.write_text('{"beta": 0.2, "rank": 3}')
    cfg = config_from_args(
        parser.parse_args(["--preset", "demo", "--config", str(path), "--set", "rank=4", "--set", "run_id=x"])
    )
    assert (cfg.dataset, cfg.beta, cfg.rank, cfg.run_id) == ("clinc150", 0.2, 4, "x")
    with pytest.raises(ValueError, match="unknown run configuration keys"):
        config_from_args(parser.parse_args(["--set", "nope=1"]))


def test_every_clinc150_preset_numbers_intents_alphabetically_as_the_paper():
    clinc = [name for name, values in PRESETS.items() if values["dataset"] == "clinc150"]
    assert "paper-clinc150-b0.5" in clinc and "cpu-clinc150-full" in clinc
    assert all(RunConfig(**PRESETS[name]).class_order == "alphabetical" for name in clinc)
    full = RunConfig(**PRESETS["cpu-clinc150-full"])
    assert (full.train_per_class, full.num_clients, full.rounds_per_task, full.batch_size, full.max_length) == (
        0,
        10,
        5,
        16,
        64,
    )
