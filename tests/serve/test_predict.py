"""lorm-predict on the exports of finished runs: the predictions the runs' evaluations counted."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

import pytest

from common.wire.model_card import CARD_FILE, ModelCard
from engine.simulation import run_inprocess
from serve import predict

from exports import CLASSES, OWN_TEXT, counted, finished_run, held_out_rows, image_config, image_folder, per_task
from own_data import write_rows
from procenv import ROOT, project_pythonpath


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def lorm_predict(*args: str, stdin: str = "") -> Done:
    """``lorm-predict args`` run in this process: the main its console script calls, its exit code and output.
    A process of its own would spend seconds importing torch and transformers for each call;
    :func:`lorm_predict_process` runs the program itself, once."""
    out, err = io.StringIO(), io.StringIO()
    with (
        contextlib.redirect_stdout(out),
        contextlib.redirect_stderr(err),
        mock.patch.object(sys, "stdin", io.StringIO(stdin)),
    ):
        returncode = predict.main(list(args))
    return Done(returncode, out.getvalue(), err.getvalue())


def lorm_predict_process(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess:
    """``python -m serve.predict args`` in a fresh process with a bare environment (one torch thread, as every
    process the tests start)."""
    env = {"PYTHONPATH": project_pythonpath(), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, "-m", "serve.predict", *args],
        input=stdin,
        capture_output=True,
        text=True,
        cwd=ROOT,
        env=env,
        timeout=300,
    )


@pytest.fixture(scope="module")
def lorm_run(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("lorm") / "results")


def predicted_labels(stdout: str) -> list[str]:
    return [line.split("\t")[0] for line in stdout.splitlines()]


def test_the_export_card_names_what_rebuilds_the_model(lorm_run):
    card = ModelCard.from_json((lorm_run / CARD_FILE).read_text())
    assert card.classes == CLASSES and card.preprocessing.max_length == 8
    assert (card.backbone.name, card.backbone.model_seed, card.weights) == ("tiny-bert", 0, "adapter")
    assert card.tasks == [[0, 2], [2, 4], [4, 6]] and card.tasks_trained == 3 and card.missing() == []


def test_predictions_from_a_file_are_those_the_evaluation_counted(lorm_run, tmp_path):
    rows = held_out_rows()
    sentences = tmp_path / "sentences.txt"
    sentences.write_text("".join(f"{text}\n" for text, _ in rows))
    done = lorm_predict(str(lorm_run), "--file", str(sentences), "--batch-size", "5")
    assert done.returncode == 0, done.stderr
    labels = predicted_labels(done.stdout)
    assert len(labels) == len(rows)
    correct, total = counted(lorm_run)
    assert sum(total) == len(rows)  # the clients' test shares together are the whole test split
    card = ModelCard.from_json((lorm_run / CARD_FILE).read_text())
    assert per_task([y for _, y in rows], labels, CLASSES, card.tasks) == correct
    assert [line.split("\t")[2] for line in done.stdout.splitlines()] == [text for text, _ in rows]


def test_arguments_standard_input_and_json_give_the_same_answers(lorm_run):
    """The program as a process of its own, reading standard input, answers as its main does in the test's."""
    texts = [text for text, _ in held_out_rows()[:6]]
    by_args = lorm_predict(str(lorm_run), *texts)
    by_stdin = lorm_predict_process(str(lorm_run), "--json", "--batch-size", "4", stdin="\n".join(texts) + "\n")
    assert by_args.returncode == 0 and by_stdin.returncode == 0, (by_args.stderr, by_stdin.stderr)
    as_json = [json.loads(line) for line in by_stdin.stdout.splitlines()]
    assert [j["label"] for j in as_json] == predicted_labels(by_args.stdout)
    assert [j["input"] for j in as_json] == texts
    assert all(0.0 < j["score"] <= 1.0 and CLASSES[j["index"]] == j["label"] for j in as_json)


def test_a_run_whose_files_name_the_classes_exports_them_in_head_order(tmp_path):
    """No data.classes: the clients' description names the classes as the files give them (first seen first),
    and max_length 0 as they counted it; lorm-predict serves the export as the run's evaluation counted."""
    rows = list(reversed(held_out_rows()))  # another first-seen order than CLASSES
    with (OWN_TEXT / "train.csv").open() as f:
        train = [(row["text"], row["label"]) for row in csv.DictReader(f)][::-1]
    write_rows(tmp_path / "train.csv", train)
    results = finished_run(
        tmp_path / "results",
        num_tasks=2,
        rounds_per_task=1,
        local_epochs=1,
        max_length=0,
        settings={"data": {"train_file": str(tmp_path / "train.csv"), "test_file": str(OWN_TEXT / "test.csv")}},
    )
    card = ModelCard.from_json((results / CARD_FILE).read_text())
    first_seen = list(dict.fromkeys(label for _, label in train))
    assert card.classes == first_seen != CLASSES and card.missing() == []
    assert card.preprocessing.max_length is not None and card.preprocessing.max_length % 8 == 0  # as counted
    done = lorm_predict(str(results), *[text for text, _ in rows])
    assert done.returncode == 0, done.stderr
    correct, _ = counted(results)
    assert per_task([y for _, y in rows], predicted_labels(done.stdout), first_seen, card.tasks) == correct
    # A card without them (an older version's clients described none) is refused by name.
    unnamed = json.loads((results / CARD_FILE).read_text()) | {"classes": None}
    (results / CARD_FILE).write_text(json.dumps(unnamed))
    done = lorm_predict(str(results), "set an alarm")
    assert done.returncode == 2 and "class names" in done.stderr and "data.classes" in done.stderr, done.stderr


def test_a_directory_without_a_card_is_no_export(lorm_run, tmp_path):
    half = tmp_path / "half"
    shutil.copytree(lorm_run, half)
    (half / CARD_FILE).unlink()
    done = lorm_predict(str(half), "set an alarm")
    assert done.returncode == 2 and "no model.json" in done.stderr, done.stderr


@pytest.mark.parametrize("strategy", ["fedavg"])
def test_a_full_fine_tuning_export_predicts_what_its_evaluation_counted(strategy, tmp_path):
    check_method(strategy, tmp_path)


def check_method(strategy: str, tmp_path) -> None:
    results = finished_run(tmp_path / "results", method=strategy, rounds_per_task=1, local_epochs=1)
    rows = held_out_rows()
    done = lorm_predict(str(results), *[text for text, _ in rows])
    assert done.returncode == 0, done.stderr
    card = ModelCard.from_json((results / CARD_FILE).read_text())
    correct, _ = counted(results)
    assert per_task([y for _, y in rows], predicted_labels(done.stdout), CLASSES, card.tasks) == correct


def test_images_by_path_are_predicted_as_the_evaluation_counted(tmp_path):
    """An image model (tiny-vit on a folder of images): lorm-predict takes image paths."""
    classes = ["cat", "dog", "fox", "owl"]
    paths = image_folder(tmp_path / "images", classes, {"train": 6, "test": 3})["test"]
    labels = [Path(path).parent.name for path in paths]
    results = tmp_path / "results"
    run_inprocess(image_config(tmp_path / "images", classes), results_dir=results)
    done = lorm_predict(str(results), "--batch-size", "5", *paths)
    assert done.returncode == 0, done.stderr
    card = ModelCard.from_json((results / CARD_FILE).read_text())
    assert card.preprocessing.image_transforms == "imagefolder" and card.preprocessing.image_size == 16
    correct, total = counted(results)
    assert sum(total) == len(paths)
    assert per_task(labels, predicted_labels(done.stdout), classes, card.tasks) == correct
