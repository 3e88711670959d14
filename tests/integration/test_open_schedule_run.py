"""Clients on their own data and an open schedule, as real processes, end to end. A coordinator given no data path
starts an open schedule of one task (``--task``, ``--open``); three clients train on their own CSVs: one holds no
class of the first task, one holds a label in no task. The operator appends task 1 while task 0 runs; the
coordinator is killed between tasks and restarted (it resumes idle, the appended schedule kept); a fourth client
joins while it idles and trains in the last task, which the operator appends; ``lorm-admin finish`` ends the run.
The final adapter, head and accuracy counts are the in-process engine's over the same per-client files, bit for
bit, and ``lorm-predict`` on the export gives the run's counts on every client's test file. After each task the
model is exported while the run goes on, and a watching server (``serve.watch.ModelSlot``) serves it."""

from __future__ import annotations

import json

from common.infra.tls import token_digest
from common.wire.model_card import CARD_FILE, ModelCard
from engine.simulation import run_inprocess
from serve.model import Classifier
from serve.watch import ModelSlot
from server.admin import main as admin

from own_data import CLASSES, TASKS, assert_the_engines_run, data_flags, four_clients, owned_config

TOKEN = "operator-open-schedule-token"


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

    metrics = assert_the_engines_run(c.run_dir / "results", inprocess, result.matrix, folder, capsys)
    assert [entry["clients"] for entry in metrics["history"] if entry["task"] == 2][0] == 4
    assert all(entry["clients"] == 3 for entry in metrics["history"] if entry["task"] < 2)
