"""Clients on their own data, for the tests: per-client files cut from tests/data/own-text, and a tiny run."""

from __future__ import annotations

import csv
import json
from pathlib import Path

import torch
from safetensors.torch import load_file

from common.run.config import RunConfig
from common.wire.model_card import CARD_FILE, ModelCard
from serve import predict

ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = ROOT / "tests" / "data" / "own-text"
SCHEDULED = ["alarm", "balance", "greeting", "music"]  # two tasks of two classes; timer and weather are in none
Rows = list[tuple[str, str]]


def own_text_rows(split: str) -> Rows:
    return own_text_rows_of(OWN_TEXT / f"{split}.csv")


def own_text_rows_of(path: Path) -> Rows:
    with path.open(newline="") as f:
        return [(row["text"], row["label"]) for row in csv.DictReader(f)]


def by_label(rows: Rows) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text, label in rows:
        out.setdefault(label, []).append(text)
    return out


def write_rows(path: Path, rows: Rows) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def disjoint_clients(folder: Path) -> Path:
    """Three clients' disjoint files of own-text: client 0 holds every scheduled class (6 rows each),
    client 1 only task 0's (alarm, balance: none of task 1), client 2 only task 1's and 6 rows of
    ``timer``, a label in no task. Test splits: clients 0 and 2 (``client<i>-test.csv``, halves of the
    scheduled classes' test rows); client 1 has none."""
    folder.mkdir(parents=True, exist_ok=True)
    train = by_label(own_text_rows("train"))
    shares = {
        0: [(label, slice(0, 6)) for label in SCHEDULED],
        1: [("alarm", slice(6, 12)), ("balance", slice(6, 12))],
        2: [("greeting", slice(6, 12)), ("music", slice(6, 12)), ("timer", slice(0, 6))],
    }
    for i, share in shares.items():
        write_rows(folder / f"client{i}.csv", [(text, label) for label, cut in share for text in train[label][cut]])
    test = [row for row in own_text_rows("test") if row[1] in SCHEDULED]
    write_rows(folder / "client0-test.csv", test[0::2])
    write_rows(folder / "client2-test.csv", test[1::2])
    return folder


def owned_config(clients_dir: Path | None = None, **changes: object) -> RunConfig:
    """A run of tiny-bert on the clients' own files: classes ``SCHEDULED`` in 2 tasks, seconds on one thread.
    ``clients_dir``: the engine's folder of every client's data (absent: a coordinator's configuration)."""
    data: dict[str, object] = {"owned": True, "classes": list(SCHEDULED)}
    if clients_dir is not None:
        data["clients_dir"] = str(clients_dir)
    base = dict(
        run_id="owned",
        dataset="textfile",
        backbone="tiny-bert",
        num_tasks=2,
        num_clients=3,
        rounds_per_task=2,
        local_epochs=1,
        rank=2,
        max_length=16,
        lr=3e-2,
        lr_lora=1e-3,
        threads=1,
        seed=5,
        settings={"data": data},
    )
    return RunConfig(**{**base, **changes})  # type: ignore[arg-type]


# An open schedule of three tasks that grows while it runs (the operator appends tasks 1 and 2)
TASKS = [["alarm", "balance"], ["greeting", "music"], ["timer"]]  # 'weather' is in no task
CLASSES = [name for task in TASKS for name in task]
TEST_FILES = {0: "client0-test.csv", 2: "client2-test.csv"}


def four_clients(folder):
    """own-text's 12 training rows of each class, cut without overlap: client 0 holds 4 of every scheduled
    class; client 1 only task 1's and 2's (none of task 0); client 2 task 0's and 1's and 6 of 'weather', a
    label in no task; client 3, the late one, only the last task's. Clients 0 and 2 hold halves of the
    scheduled classes' test rows."""
    folder.mkdir()
    train = by_label(own_text_rows("train"))
    shares = {
        0: [(label, slice(0, 4)) for label in CLASSES],
        1: [(label, slice(4, 8)) for label in ("greeting", "music", "timer")],
        2: [(label, slice(4, 8)) for label in ("alarm", "balance")]
        + [(label, slice(8, 12)) for label in ("greeting", "music")]
        + [("weather", slice(0, 6))],
        3: [("timer", slice(8, 12))],
    }
    for i, share in shares.items():
        write_rows(folder / f"client{i}.csv", [(text, label) for label, cut in share for text in train[label][cut]])
    test = [row for row in own_text_rows("test") if row[1] in CLASSES]
    write_rows(folder / TEST_FILES[0], test[0::2])
    write_rows(folder / TEST_FILES[2], test[1::2])
    return folder


def data_flags(folder, i: int) -> list[str]:
    test = ["--test-data", str(folder / TEST_FILES[i])] if i in TEST_FILES else []
    return ["--data", str(folder / f"client{i}.csv"), *test]


def assert_same_tensors(want_file, got_file) -> None:
    want, got = load_file(str(want_file)), load_file(str(got_file))
    assert got.keys() == want.keys()
    for key in want:
        assert torch.equal(got[key], want[key]), (got_file, key)


def predicted_correct(export, folder, card: ModelCard, capsys) -> list[int]:
    """``lorm-predict`` over every client's test file: correct predictions per task, as the run counts them."""
    correct = [0] * len(card.tasks)
    for name in TEST_FILES.values():
        rows = own_text_rows_of(folder / name)
        sentences = folder / f"{name}.txt"
        sentences.write_text("".join(f"{text}\n" for text, _ in rows))
        assert predict.main([str(export), "--file", str(sentences), "--batch-size", "4"]) == 0
        labels = [line.split("\t")[0] for line in capsys.readouterr().out.splitlines()]
        assert len(labels) == len(rows)
        for (_, label), guess in zip(rows, labels):
            if label not in card.classes:
                continue  # a class of no task the run trained: the run leaves it out of its counts
            y = card.classes.index(label)
            task = next(t for t, (lo, hi) in enumerate(card.tasks) if lo <= y < hi)
            correct[task] += guess == label
    return correct


def assert_the_engines_run(
    results: Path, inprocess: Path, counts, folder: Path, capsys, tasks: list[list[str]] = TASKS
) -> dict:
    """The open schedule's export in ``results`` is the in-process engine's (its ``counts``, its files in
    ``inprocess``), bit for bit, its tasks ``tasks``, and ``lorm-predict`` on it gives the run's counts on every
    client's test file; the run's metrics."""
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["correct"] == counts.correct and metrics["total"] == counts.total
    assert all(total > 0 for row in metrics["total"] for total in row)
    for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
        assert_same_tensors(inprocess / name, results / name)
    card = ModelCard.from_json((results / CARD_FILE).read_text())
    bounds = [sum(len(t) for t in tasks[:i]) for i in range(len(tasks) + 1)]
    assert card.classes == [name for task in tasks for name in task]
    assert card.tasks == [list(pair) for pair in zip(bounds, bounds[1:])] and card.tasks_trained == len(tasks)
    assert predicted_correct(results, folder, card, capsys) == metrics["correct"][-1]
    return metrics
