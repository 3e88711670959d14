"""Clients on their own data and an open schedule, as real processes, end to end. A coordinator given no data path
starts an open schedule of one task (``--task``, ``--open``); three clients train on their own CSVs: one holds no
class of the first task, one holds a label in no task. The operator appends task 1 while task 0 runs; the
coordinator is killed between tasks and restarted (it resumes idle, the appended schedule kept); a fourth client
joins while it idles and trains in the last task, which the operator appends; ``lorm-admin finish`` ends the run.
The final adapter, head and accuracy counts are the in-process engine's over the same per-client files, bit for
bit, and ``lorm-predict`` on the export gives the run's counts on every client's test file. After each task the
model is exported while the run goes on, and a watching server (``serve.watch.ModelSlot``) serves it."""

from __future__ import annotations

import csv
import json

import torch
from safetensors.torch import load_file

from common.infra.tls import token_digest
from common.wire.model_card import CARD_FILE, ModelCard
from engine.simulation import run_inprocess
from serve import predict
from serve.model import Classifier
from serve.watch import ModelSlot
from server.admin import main as admin

from own_data import by_label, own_text_rows, owned_config, write_rows

TOKEN = "operator-open-schedule-token"
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
            y = card.classes.index(label)
            task = next(t for t, (lo, hi) in enumerate(card.tasks) if lo <= y < hi)
            correct[task] += guess == label
    return correct


def own_text_rows_of(path) -> list[tuple[str, str]]:
    with path.open(newline="") as f:
        return [(row["text"], row["label"]) for row in csv.DictReader(f)]


def test_a_federation_on_own_data_grows_survives_a_restart_takes_a_late_client_and_is_the_engines_run(
    cluster, tmp_path, capsys
):
    folder = four_clients(tmp_path / "clients")
    data = {"owned": True, "classes": CLASSES, "max_classes": 6}
    engine = owned_config(folder, num_clients=4, num_tasks=3, task_sizes=[2, 2, 1], settings={"data": data})
    engine.settings["data"]["clients_dir"] = str(folder)
    inprocess = tmp_path / "inprocess"
    result = run_inprocess(engine, results_dir=inprocess)  # the schedule known from the start, four clients

    coordinator = owned_config(num_clients=4, num_tasks=1, settings={"data": {**data, "classes": TASKS[0]}})
    assert coordinator.data_dir == "" and "clients_dir" not in coordinator.settings["data"]
    c = cluster(coordinator.to_json(), insecure=True)
    digest, token = tmp_path / "operator.sha256", tmp_path / "operator.token"
    digest.write_text(token_digest(TOKEN))
    token.write_text(TOKEN)
    flags = ["--task", ",".join(TASKS[0]), "--open", "--operator-digest-file", str(digest), "--start-with", "3"]
    operator = ["--target", f"127.0.0.1:{c.port}", "--insecure", "--operator-token-file", str(token)]
    no_data = {"LORM_DATA_DIR": ""}

    server = c.server(*flags, env=no_data)
    server.wait_for("serving on")
    clients = [c.client(i, *data_flags(folder, i), env=no_data) for i in range(3)]
    server.wait_for("task 0 starts", timeout=120)  # the run lives: task 0 runs, or is over and the run idles
    assert admin(["add-task", "--classes", ",".join(TASKS[1]), *operator]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == TASKS[:2]
    server.wait_for("task 1 was the schedule's last: the run is open", timeout=240)
    # The model after each task is exported while the run goes on, and a server watching the results serves it.
    slot = ModelSlot(c.run_dir / "results", Classifier)
    assert slot.poll() and slot.stamp is not None and slot.stamp.path.name == "task-1"
    assert slot.current is not None and slot.current.card.tasks_trained == 2 and slot.current.classes == CLASSES[:4]
    assert {p.label for p in slot.current.predict(["wake me up at six", "play some jazz"])} <= set(CLASSES[:4])
    assert ModelCard.from_json((c.run_dir / "results" / "task-0" / CARD_FILE).read_text()).tasks_trained == 1

    server.kill()  # between tasks: the run idles, its appended schedule on disk
    server = c.server(*flags, env=no_data)
    server.wait_for("resumed run owned at idle task 2")
    late = c.client(3, *data_flags(folder, 3), env=no_data)
    late.wait_for("joined run owned as client 3")
    late.wait_for("shard sizes per task")  # it built its model and polls the idle run
    assert admin(["add-task", "--classes", ",".join(TASKS[2]), *operator]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == TASKS  # the restarted coordinator kept task 1
    assert admin(["finish", *operator]) == 0  # the run ends after its last scheduled task
    capsys.readouterr()

    assert server.wait(timeout=300) == 0, "".join(server.lines[-30:])
    assert all(p.wait(timeout=60) == 0 for p in [*clients, late])
    logs = ["".join(p.lines) for p in [*clients, late]]
    assert "shard sizes per task [0]" in logs[1]  # none of task 0's classes: it took part all the same
    assert "shard sizes per task [0, 8]" in logs[1] and "shard sizes per task [0, 8, 4]" in logs[1]  # it grew
    assert "shard sizes per task [0, 0, 4]" in logs[3]
    # reported once per schedule the client learns: at last only 'weather', the label in no task
    left_out = [line for line in clients[2].lines if "client2.csv: " in line and "in no task of the run" in line]
    assert len(left_out) == len(TASKS) and left_out[-1].split("left out: ")[1].startswith("'weather' (6)  [")
    assert "task 2 round" in logs[3] and "task 0 round" not in logs[3]  # the late client trained in task 2 only

    results = c.run_dir / "results"
    metrics = json.loads((results / "metrics.json").read_text())
    assert [entry["clients"] for entry in metrics["history"] if entry["task"] == 2][0] == 4
    assert all(entry["clients"] == 3 for entry in metrics["history"] if entry["task"] < 2)
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert all(total > 0 for row in metrics["total"] for total in row)
    for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
        assert_same_tensors(inprocess / name, results / name)

    card = ModelCard.from_json((results / CARD_FILE).read_text())
    assert card.classes == CLASSES and card.tasks == [[0, 2], [2, 4], [4, 5]] and card.tasks_trained == 3
    assert predicted_correct(results, folder, card, capsys) == metrics["correct"][-1]
