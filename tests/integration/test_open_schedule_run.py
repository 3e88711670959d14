"""Issue 43 part 3 as real processes: a coordinator started with an open schedule of one task (``--task``,
``--open``) and two clients on their own CSVs; the operator appends a second task while the run idles; the
coordinator is killed and restarted between tasks (it resumes idle, with the appended schedule); a third client
joins for the last task, which the operator appends; ``lorm-admin finish`` ends the run after it. The run
completes with every task's accuracy recorded, and the late client took part in the last task. After each task
the model is exported while the run idles, and a watching server (``serve.watch.ModelSlot``) swaps it in."""

from __future__ import annotations

import json

from common.infra.tls import token_digest
from serve.model import Classifier
from serve.watch import ModelSlot
from server.admin import main as admin

from own_data import by_label, own_text_rows, owned_config, write_rows

TOKEN = "operator-open-schedule-token"
TASKS = [["alarm", "balance"], ["greeting", "music"], ["timer", "weather"]]


def three_clients(folder):
    """Clients 0 and 1: a third of own-text's training rows of every class each, half its test rows each;
    client 2 (the late one): the last third of timer and weather (the last task's) and of alarm, no test split."""
    folder.mkdir()
    train, test = by_label(own_text_rows("train")), by_label(own_text_rows("test"))
    for i in range(2):
        write_rows(folder / f"client{i}.csv", [(t, label) for label in train for t in train[label][4 * i : 4 * i + 4]])
        write_rows(folder / f"client{i}-test.csv", [(t, label) for label in test for t in test[label][i::2]])
    late = [(t, label) for label in ("alarm", "timer", "weather") for t in train[label][8:]]
    write_rows(folder / "client2.csv", late)
    return folder


def test_an_open_schedule_grows_survives_a_restart_and_takes_a_late_client(cluster, tmp_path, capsys):
    folder = three_clients(tmp_path / "clients")
    config = owned_config(num_tasks=1, settings={"data": {"owned": True, "classes": TASKS[0], "max_classes": 6}})
    c = cluster(config.to_json(), insecure=True)
    digest, token = tmp_path / "operator.sha256", tmp_path / "operator.token"
    digest.write_text(token_digest(TOKEN))
    token.write_text(TOKEN)
    flags = ["--task", ",".join(TASKS[0]), "--open", "--operator-token-file", str(digest)]
    flags += ["--start-with", "2", "--quorum", "2", "--round-deadline", "3"]  # client 2 comes late
    operator = ["--target", f"127.0.0.1:{c.port}", "--insecure", "--operator-token-file", str(token)]

    def own(i: int) -> list[str]:
        test = folder / f"client{i}-test.csv"
        return ["--data", str(folder / f"client{i}.csv"), *(["--test-data", str(test)] if test.exists() else [])]

    server = c.server(*flags)
    server.wait_for("serving on")
    clients = [c.client(i, *own(i)) for i in range(2)]
    server.wait_for("task 0 was the schedule's last: the run is open", timeout=240)
    # The model after task 0 is exported while the run idles, and a server watching the results serves it.
    slot = ModelSlot(c.run_dir / "results", Classifier)
    assert slot.poll() and slot.stamp is not None and slot.stamp.path.name == "task-0"
    assert slot.current is not None and slot.current.card.tasks_trained == 1 and slot.current.classes == TASKS[0]
    assert {p.label for p in slot.current.predict(["wake me up at six", "play some jazz"])} <= set(TASKS[0])
    assert admin(["add-task", "--classes", ",".join(TASKS[1]), *operator]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == TASKS[:2]
    server.wait_for("task 1 was the schedule's last: the run is open", timeout=240)
    assert slot.poll() and slot.version == 2 and slot.stamp is not None and slot.stamp.path.name == "task-1"
    assert slot.current is not None and slot.current.card.tasks_trained == 2 and slot.current.card.seen_classes == 4

    server.kill()  # between tasks: the run is idle, its appended schedule on disk
    server = c.server(*flags)
    server.wait_for("resumed run owned at idle task 2")
    late = c.client(2, *own(2))
    late.wait_for("joined run owned as client 2")
    late.wait_for("shard sizes per task")  # built its model: it polls the idle run
    assert admin(["add-task", "--classes", ",".join(TASKS[2]), *operator]) == 0
    assert json.loads(capsys.readouterr().out)["schedule"] == TASKS  # the restarted coordinator kept task 1
    assert admin(["finish", *operator]) == 0  # the run ends after its last scheduled task
    capsys.readouterr()

    assert server.wait(timeout=300) == 0, "".join(server.lines[-30:])
    assert all(p.wait(timeout=60) == 0 for p in [*clients, late])
    logs = ["".join(p.lines) for p in [*clients, late]]
    assert all("the run's schedule now has 2 tasks" in log for log in logs[:2])
    assert "the run's schedule now has 3 tasks" in logs[2] and "shard sizes per task [4, 0]" in logs[2]
    assert "task 2 round" in logs[2]  # the late client trained in the last task

    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert len(metrics["total"]) == 3 and all(total > 0 for row in metrics["total"] for total in row)
    last = [entry for entry in metrics["history"] if entry["task"] == 2]
    assert any(entry["clients"] == 3 for entry in last), last
    assert all(entry["clients"] == 2 for entry in metrics["history"] if entry["task"] < 2)
    card = json.loads((c.run_dir / "results" / "model.json").read_text())
    assert card["classes"] == [name for task in TASKS for name in task] and card["num_classes"] == 6
    exported = [json.loads((c.run_dir / "results" / f"task-{t}" / "model.json").read_text()) for t in range(3)]
    assert [e["tasks_trained"] for e in exported] == [1, 2, 3]  # the restart kept task 1's, and wrote task 2's
    assert exported[2]["classes"] == card["classes"] and slot.poll() and slot.current.card.tasks_trained == 3
