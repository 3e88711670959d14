"""A client's own data: labels matched by name to the run's schedule, unscheduled labels counted and
reported once, tasks none of whose classes it holds, its flags, and the folder of every client's data."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from client.local import (
    LocalSettingError,
    LocalSettings,
    add_local_arguments,
    check_own_data,
    local_from_args,
    refuse_coordinator_local,
    split,
)
from client.owned import OwnData, client_files, load_owned
from client.runtime import build_runtime
from client.splits import DatasetError
from common.run.schedule import class_schedule

from own_data import SCHEDULED, disjoint_clients, owned_config, write_rows

SCHEDULE = [["alarm", "balance"], ["greeting", "music"]]


def test_labels_are_matched_by_name_and_unscheduled_rows_are_left_out_and_reported_once(tmp_path, caplog):
    rows = [("a1", "music"), ("b1", "alarm"), ("x1", "timer"), ("a2", "music"), ("x2", "weather"), ("x3", "timer")]
    train = write_rows(tmp_path / "mine.csv", rows)
    test = tmp_path / "mine-test.jsonl"
    test.write_text("\n".join(json.dumps({"text": t, "label": c}) for t, c in [("t1", "balance"), ("t2", "other")]))
    with caplog.at_level(logging.INFO, logger="lorm.client"):
        splits = load_owned(owned_config(), SCHEDULE, OwnData(str(train), str(test)))
    assert splits.class_names == SCHEDULED  # every scheduled class, held here or not: the head's rows
    assert splits.train_x == ["a1", "b1", "a2"] and splits.train_y.tolist() == [3, 0, 3]  # file order, ids by name
    assert splits.test_x == ["t1"] and splits.test_y.tolist() == [1]
    warned = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warned == [
        f"{train}: 3 samples have a label in no task of the run, left out: 'timer' (2), 'weather' (1)",
        f"{test}: 1 sample has a label in no task of the run, left out: 'other' (1)",
    ]
    assert any(
        "3 training samples of 2 of the run's 4 classes; per task [1, 2]" in r.getMessage() for r in caplog.records
    )


def test_an_image_folder_of_class_folders(tmp_path, caplog):
    for name, count in (("greeting", 2), ("alarm", 1), ("cats", 3)):
        (tmp_path / "imgs" / name).mkdir(parents=True)
        for k in range(count):
            pixels = np.random.default_rng(k).integers(0, 255, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(tmp_path / "imgs" / name / f"{k}.png")
    with caplog.at_level(logging.WARNING, logger="lorm.client"):
        splits = load_owned(owned_config(dataset="imagefolder"), SCHEDULE, OwnData(str(tmp_path / "imgs")))
    assert splits.kind == "image" and splits.transforms is not None
    assert splits.train_y.tolist() == [0, 2, 2] and splits.test_x == [] and splits.test_y.shape == (0,)
    assert [r.getMessage() for r in caplog.records] == [
        f"{tmp_path / 'imgs'}: 3 samples have a label in no task of the run, left out: 'cats' (3)"
    ]
    with pytest.raises(DatasetError, match="holds image samples but --test-data .* text"):
        load_owned(owned_config(), SCHEDULE, OwnData(str(tmp_path / "imgs"), str(write_rows(tmp_path / "t.csv", []))))


def test_a_schedule_that_the_configuration_cuts_otherwise_is_refused(tmp_path):
    own = OwnData(str(write_rows(tmp_path / "mine.csv", [("a", "alarm")])))
    with pytest.raises(DatasetError, match=r"tasks of \[1, 3\] classes, its configuration .* cuts \[2, 2\]"):
        load_owned(owned_config(), [["alarm"], ["balance", "greeting", "music"]], own)
    with pytest.raises(FileNotFoundError, match="nowhere.csv: no such file or folder"):
        load_owned(owned_config(), SCHEDULE, OwnData(str(tmp_path / "nowhere.csv")))


def test_a_client_holding_none_of_a_tasks_classes_has_an_empty_shard_and_evaluates_its_own_test_split(tmp_path):
    folder = disjoint_clients(tmp_path)
    config = owned_config()
    schedule = class_schedule(config)
    assert schedule == SCHEDULE
    runtime = build_runtime(config, OwnData(str(folder / "client1.csv")), schedule)  # alarm, balance only
    worker = runtime.worker(1, "client-1")
    assert [int(s.numel()) for s in worker.shards] == [12, 0]
    assert worker.test_idx.numel() == 0  # no --test-data: nothing to evaluate, nothing to divide
    mine = build_runtime(config, client_files(folder, 0), schedule).worker(0, "client-0")
    assert [int(s.numel()) for s in mine.shards] == [12, 12] and mine.test_idx.tolist() == list(range(8))
    with pytest.raises(DatasetError, match="the run names no classes: .*data.classes"):
        build_runtime(config, OwnData(str(folder / "client1.csv")), None)


def test_the_folder_of_every_clients_data(tmp_path):
    disjoint_clients(tmp_path)
    assert client_files(tmp_path, 0) == OwnData(str(tmp_path / "client0.csv"), str(tmp_path / "client0-test.csv"))
    assert client_files(tmp_path, 1) == OwnData(str(tmp_path / "client1.csv"), "")
    (tmp_path / "client3" / "train" / "alarm").mkdir(parents=True)  # an image client in a folder of its own
    assert client_files(tmp_path, 3) == OwnData(str(tmp_path / "client3" / "train"), "")
    write_rows(tmp_path / "client3" / "test.jsonl", [])
    assert client_files(tmp_path, 3).test == str(tmp_path / "client3" / "test.jsonl")
    with pytest.raises(FileNotFoundError, match="holds no data of client 4: expected client4.csv"):
        client_files(tmp_path, 4)


def parsed(*argv: str) -> LocalSettings:
    parser = argparse.ArgumentParser()
    add_local_arguments(parser)
    return local_from_args(parser.parse_args(list(argv)))


def test_the_clients_own_data_comes_from_its_flags_only(monkeypatch):
    assert parsed("--data", "a.csv", "--test-data", "b.csv").own() == OwnData("a.csv", "b.csv")
    monkeypatch.setenv("LORM_CLIENT_DATA", "/data/mine")
    assert parsed().own() == OwnData("/data/mine")
    monkeypatch.delenv("LORM_CLIENT_DATA")
    assert parsed().own() is None
    with pytest.raises(ValueError, match="--test-data is the test split of --data: give --data too"):
        parsed("--test-data", "b.csv")
    with pytest.raises(ValueError, match="--data is this client's whole training data; it takes no --train-file"):
        parsed("--data", "a.csv", "--train-file", "t.csv")


def test_the_run_and_the_client_agree_on_whose_data_it_trains_on():
    owned = owned_config()
    check_own_data(owned, LocalSettings(data="a.csv"))
    with pytest.raises(LocalSettingError, match="sets data.owned=true\\): pass --data PATH"):
        check_own_data(owned, LocalSettings())
    with pytest.raises(LocalSettingError, match="given --data, but the run's clients train on their shards"):
        check_own_data(owned.replace(settings={"data": {"classes": SCHEDULED}}), LocalSettings(data="a.csv"))


def test_a_coordinator_configuration_that_names_the_clients_folder_is_refused_and_a_launcher_splits_it(tmp_path):
    disjoint_clients(tmp_path)
    both = owned_config(tmp_path)
    with pytest.raises(LocalSettingError, match=f"sets data.clients_dir={tmp_path}: .*pass --data and --test-data"):
        refuse_coordinator_local(both, LocalSettings())
    shared, local = split(both)
    refuse_coordinator_local(shared, local)
    assert shared.settings == {"data": {"owned": True, "classes": SCHEDULED}}
    assert local.for_client(1).args() == ["--data", str(tmp_path / "client1.csv")]
    assert local.for_client(2).args() == [
        "--data",
        str(tmp_path / "client2.csv"),
        "--test-data",
        str(Path(tmp_path) / "client2-test.csv"),
    ]


def test_lorm_spec_takes_the_coordinators_schedule_flags_and_describes_the_heads_rows(tmp_path, capsys):
    """``lorm-spec --task ... --set data.max_classes=N``: the head the clients of that coordinator build (N
    rows, not the scheduled classes'), else every client's Describe would differ from ``--model-spec``."""
    from client import spec
    from common.wire.messages import ModelSpec

    out = tmp_path / "spec.json"
    argv = ["--set", "dataset=textfile", "--set", "backbone=tiny-bert", "--set", "max_length=8"]
    argv += ["--task", "alarm,balance", "--open", "--set", "data.max_classes=5", "--out", str(out)]
    assert spec.main(argv) == 0 and "5 classes" in capsys.readouterr().out
    assert ModelSpec.from_json(out.read_text()).num_classes == 5


def test_the_report_of_labels_in_no_task_names_five_and_counts_the_rest(tmp_path, caplog):
    """A file of many labels outside the run's schedule: one line naming five of them and counting the others, not a
    screenful."""
    from collections import Counter

    from client.owned import report_unscheduled

    unscheduled = Counter({f"label-{i}": i + 1 for i in range(8)})
    with caplog.at_level(logging.WARNING, logger="lorm.client"):
        report_unscheduled(tmp_path / "mine.csv", unscheduled)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "36 samples have a label in no task of the run" in line and line.count("'label-") == 5
    assert "and 3 more" in line
