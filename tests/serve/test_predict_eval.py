"""lorm-predict --eval on the exports of finished runs: a run's test split, written as a labelled file, scores
exactly the counts the run's evaluation recorded, task by task; what cannot be scored is reported, never dropped."""

from __future__ import annotations

import contextlib
import csv
import io
import json
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from common.methods import registry
from common.wire.model_card import CARD_FILE, ModelCard
from engine.simulation import run_inprocess
from serve import predict
from serve.evaluate import read_labelled
from serve.model import Classifier

from exports import CLASSES, finished_run, held_out_rows, image_config, image_folder, per_task
from own_data import write_rows
from procenv import ROOT, project_pythonpath

METHODS = ["lorm", "fedavg"]  # a LoRA method and a full fine-tuning one: exports of an adapter and of a delta


@dataclass
class Done:
    returncode: int
    stdout: str
    stderr: str


def lorm_predict(*args: str) -> Done:
    """``lorm-predict args`` run in this process (the main its console script calls): exit code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        returncode = predict.main(list(args))
    return Done(returncode, out.getvalue(), err.getvalue())


def evaluated(export: Path, labelled: Path, *options: str) -> dict:
    """The figures of ``lorm-predict EXPORT --eval FILE --json``, its exit status checked."""
    done = lorm_predict(str(export), "--eval", str(labelled), "--json", *options)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def recorded(results: Path) -> tuple[list[list[int]], list[list[int]]]:
    """The run's evaluations, after each task: ``correct[t][j]`` and ``total[t][j]`` of task ``j``."""
    metrics = json.loads((results / "metrics.json").read_text())
    return metrics["correct"], metrics["total"]


def write_jsonl(path: Path, rows: list[tuple[str, str]]) -> Path:
    path.write_text("".join(json.dumps({"text": text, "label": label}) + "\n" for text, label in rows))
    return path


@pytest.fixture(scope="module")
def lorm_run(tmp_path_factory):
    return finished_run(tmp_path_factory.mktemp("lorm") / "results")


@pytest.mark.parametrize("method", METHODS)
def test_the_test_split_scores_what_the_run_counted_after_every_task(method, tmp_path):
    check_method(method, tmp_path)


@pytest.mark.slow
@pytest.mark.parametrize("method", sorted(set(registry()) - set(METHODS)))
def test_every_method_scores_what_the_run_counted_after_every_task(method, tmp_path):
    check_method(method, tmp_path)


def check_method(method: str, tmp_path: Path) -> None:
    """Every export of the run (after task 0, 1 and the final one) on the whole test split: its per-task correct
    and total counts are the run's evaluation after that task; the test rows of the classes of tasks not learned
    yet are counted apart, by label, and in no accuracy."""
    results = finished_run(tmp_path / "results", method=method, rounds_per_task=1, local_epochs=1)
    rows = held_out_rows()
    files = [write_rows(tmp_path / "test.csv", rows), write_jsonl(tmp_path / "test.jsonl", rows)]
    correct, total = recorded(results)
    exports = [results / f"task-{t}" for t in range(len(correct) - 1)] + [results]
    for t, export in enumerate(exports):
        card = ModelCard.from_json((export / CARD_FILE).read_text())
        assert card.tasks_trained == t + 1
        for labelled in files:
            figures = evaluated(export, labelled)
            assert [task["correct"] for task in figures["tasks"]] == correct[t], (export, labelled)
            assert [task["total"] for task in figures["tasks"]] == total[t], (export, labelled)
            assert figures["overall"] == {
                "correct": sum(correct[t]),
                "total": sum(total[t]),
                "accuracy": 100.0 * sum(correct[t]) / sum(total[t]),
            }
            unlearned = [label for _, label in rows if CLASSES.index(label) >= card.seen_classes]
            assert figures["unlearned_classes"]["samples"] == len(unlearned) == len(rows) - sum(total[t])
            assert figures["unknown_labels"]["samples"] == 0
            assert figures["left_out_of_accuracy"] == len(unlearned)
    assert sum(total[-1]) == len(rows)  # the final export scores every row


def test_sentences_with_quotes_commas_and_line_breaks_are_scored_whole(lorm_run, tmp_path):
    """A CSV as a spreadsheet writes it (RFC 4180): each sentence reaches the model whole, as the same sentence
    given to the Classifier directly, and a line after a break inside a quote is no row of its own."""
    rows = held_out_rows()
    tricky = [
        f'{text}, "{label}"\n{label},{label}' if i % 3 == 0 else f'"{text}"; ok' if i % 3 == 1 else f"now,\r\n{text}"
        for i, (text, label) in enumerate(rows)
    ]
    labelled = tmp_path / "quoted.csv"
    with labelled.open("w", newline="") as f:
        writer = csv.writer(f)  # quotes the fields that hold a comma, a quote or a line break; "" inside
        writer.writerow(["id", "text", "label"])  # the text column found by name, another column beside it
        writer.writerows([i, text, label] for i, (text, (_, label)) in enumerate(zip(tricky, rows)))
    assert labelled.read_text().count("\n") > len(rows) + 1 and '""' in labelled.read_text()
    read = read_labelled(labelled)  # what the model is given: each sentence, its line breaks kept
    assert (read.kind, read.samples, read.labels) == ("text", tricky, [label for _, label in rows])
    figures = evaluated(lorm_run, labelled, "--batch-size", "5")
    card = ModelCard.from_json((lorm_run / CARD_FILE).read_text())
    labels = [label for _, label in rows]
    predicted = [p.label for p in Classifier(lorm_run).predict(tricky)]
    assert figures["samples"] == len(rows)
    assert [task["correct"] for task in figures["tasks"]] == per_task(labels, predicted, CLASSES, card.tasks)
    assert [task["total"] for task in figures["tasks"]] == [
        sum(lo <= CLASSES.index(y) < hi for y in labels) for lo, hi in card.tasks
    ]
    wrong = sorted((y, p) for y, p in zip(labels, predicted) if y != p)
    listed = evaluated(lorm_run, labelled, "--top", str(len(rows)))["confusions"]
    assert sorted((c["true"], c["predicted"]) for c in listed for _ in range(c["samples"])) == wrong


def test_unknown_labels_are_reported_and_left_out_of_the_accuracy(lorm_run, tmp_path):
    rows = held_out_rows()
    strange = [("snooze for ten minutes", "snooze"), ("what time is it in Rome", "clock"), ("hit snooze", "snooze")]
    labelled = write_rows(tmp_path / "test.csv", rows[:5] + strange + rows[5:])
    figures = evaluated(lorm_run, labelled)
    correct, total = recorded(lorm_run)
    assert figures["samples"] == len(rows) + 3
    assert figures["unknown_labels"] == {
        "samples": 3,
        "labels": 2,
        "examples": [{"label": "snooze", "samples": 2}, {"label": "clock", "samples": 1}],
    }
    assert figures["left_out_of_accuracy"] == 3
    # the accuracy is over the labels the model knows: the run's figures, untouched by the three
    assert figures["overall"]["correct"] == sum(correct[-1]) and figures["overall"]["total"] == sum(total[-1])
    done = lorm_predict(str(lorm_run), "--eval", str(labelled))
    assert done.returncode == 0, done.stderr
    assert "left out of every accuracy above: 3 sample(s)" in done.stdout
    assert "3 with a label that is no class of the export: 'snooze' (2), 'clock' (1)" in done.stdout
    all_line = f"{sum(correct[-1])}{sum(total[-1]):>8}{100.0 * sum(correct[-1]) / sum(total[-1]):>9.2f}%"
    assert any(line.startswith("all") and line.endswith(all_line) for line in done.stdout.splitlines()), done.stdout


def test_json_is_one_object_with_every_figure(lorm_run, tmp_path):
    """The program as a process of its own (its console entry): one JSON object whose figures add up."""
    labelled = write_rows(tmp_path / "test.csv", held_out_rows() + [("hit snooze", "snooze")])
    env = {"PYTHONPATH": project_pythonpath(), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"}
    argv = [sys.executable, "-m", "serve.predict", str(lorm_run), "--eval", str(labelled), "--json", "--top", "2"]
    done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.splitlines()) == 1
    figures = json.loads(done.stdout)
    assert set(figures) == set(
        "export file method tasks_trained num_tasks seen_classes num_classes samples tasks overall mean_task_accuracy "
        "wrong confusions confusion_pairs unknown_labels unlearned_classes left_out_of_accuracy".split()
    )
    card = ModelCard.from_json((lorm_run / CARD_FILE).read_text())
    assert (figures["export"], figures["file"]) == (str(lorm_run), str(labelled))
    assert (figures["method"], figures["tasks_trained"], figures["num_tasks"]) == ("lorm", 3, 3)
    assert (figures["seen_classes"], figures["num_classes"]) == (6, 6)
    assert [t["classes"] for t in figures["tasks"]] == card.tasks and [t["task"] for t in figures["tasks"]] == [0, 1, 2]
    for t in figures["tasks"]:
        assert set(t) == {"task", "classes", "correct", "total", "accuracy"}
        assert t["accuracy"] == pytest.approx(100.0 * t["correct"] / t["total"])
    overall = figures["overall"]
    assert overall["correct"] == sum(t["correct"] for t in figures["tasks"])
    assert overall["total"] == sum(t["total"] for t in figures["tasks"]) == figures["samples"] - 1
    assert figures["mean_task_accuracy"] == pytest.approx(sum(t["accuracy"] for t in figures["tasks"]) / 3)
    assert figures["wrong"] == overall["total"] - overall["correct"] > 0  # the tiny run errs: pairs to list
    shown = figures["confusions"]
    assert 0 < len(shown) <= 2 and len(shown) <= figures["confusion_pairs"]
    assert [c["samples"] for c in shown] == sorted((c["samples"] for c in shown), reverse=True)
    assert all(set(c) == {"true", "predicted", "samples"} and c["true"] != c["predicted"] for c in shown)
    every = evaluated(lorm_run, labelled, "--top", "100")
    assert len(every["confusions"]) == every["confusion_pairs"] == figures["confusion_pairs"]
    assert sum(c["samples"] for c in every["confusions"]) == figures["wrong"]
    assert every["confusions"][:2] == shown
    assert figures["unknown_labels"] == {"samples": 1, "labels": 1, "examples": [{"label": "snooze", "samples": 1}]}
    assert figures["unlearned_classes"] == {"samples": 0, "labels": 0, "examples": []}


@pytest.mark.parametrize(
    "name, content, line",
    [
        ("open-quote.csv", 'text,label\nset an alarm,alarm\n"wake me\nup,alarm\nplay jazz,music\n', 3),
        ("fields.csv", "text,label\nset an alarm,alarm\n\nplay jazz,music,extra\n", 4),
        ("empty-label.csv", 'text,label\n"set an\nalarm",alarm\nplay jazz,\n', 4),
        ("broken.jsonl", '{"text": "set an alarm", "label": "alarm"}\n{"text": "play jazz", "label": \n', 2),
    ],
)
def test_a_malformed_row_exits_2_naming_its_line(lorm_run, tmp_path, name, content, line):
    labelled = tmp_path / name
    labelled.write_text(content)
    done = lorm_predict(str(lorm_run), "--eval", str(labelled))
    assert done.returncode == 2 and done.stdout == ""
    assert f"{labelled} line {line}:" in done.stderr, done.stderr


def test_a_bad_export_or_a_missing_file_exits_2(lorm_run, tmp_path):
    labelled = write_rows(tmp_path / "test.csv", held_out_rows())
    done = lorm_predict(str(tmp_path), "--eval", str(labelled))
    assert done.returncode == 2 and "no model.json" in done.stderr, done.stderr
    done = lorm_predict(str(lorm_run), "--eval", str(tmp_path / "absent.csv"))
    assert done.returncode == 2 and "absent.csv: no such file or folder" in done.stderr, done.stderr
    done = lorm_predict(str(lorm_run), "--eval", str(write_rows(tmp_path / "header.csv", [])))
    assert done.returncode == 2 and "no labelled rows" in done.stderr, done.stderr


def test_an_image_folder_labelled_by_subfolder_scores_what_the_run_counted(tmp_path):
    """An image model on a folder of class-named image folders (lorm-client --data's layout): the run's counts;
    a text file is refused, saying what the model takes."""
    classes = ["cat", "dog", "fox", "owl"]
    image_folder(tmp_path / "images", classes, {"train": 6, "test": 3})
    results = tmp_path / "results"
    run_inprocess(image_config(tmp_path / "images", classes), results_dir=results)
    (tmp_path / "images" / "test" / "yak").mkdir()  # a class the model does not know: its images reported
    (tmp_path / "images" / "train" / "cat" / "0.png").rename(tmp_path / "images" / "test" / "yak" / "0.png")
    figures = evaluated(results, tmp_path / "images" / "test", "--batch-size", "5")
    correct, total = recorded(results)
    assert [t["correct"] for t in figures["tasks"]] == correct[-1]
    assert [t["total"] for t in figures["tasks"]] == total[-1]
    assert figures["unknown_labels"] == {"samples": 1, "labels": 1, "examples": [{"label": "yak", "samples": 1}]}
    done = lorm_predict(str(results), "--eval", str(write_rows(tmp_path / "test.csv", [("a cat", "cat")])))
    assert done.returncode == 2 and "holds text samples" in done.stderr and "image folders" in done.stderr
