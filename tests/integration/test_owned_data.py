"""Clients on their own data, as real processes. A coordinator with no data path states the run's
classes by name; each client reads its own file (``--data``), leaves out a label in no task, takes part in
a task none of whose classes it holds, and the run is the in-process engine's over the same files, bit for
bit (``lorm-sim --set data.clients_dir=DIR``)."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from common.run.config import RunConfig
from engine.simulation import run_inprocess

from own_data import disjoint_clients, owned_config


def test_own_data_over_grpc_is_the_engines_run_bit_for_bit(cluster, tmp_path):
    folder = disjoint_clients(tmp_path / "clients")
    out = tmp_path / "inprocess"
    result = run_inprocess(owned_config(folder), results_dir=out)  # exported as the coordinator exports

    coordinator = owned_config()  # names the classes and nothing of any client's files
    assert coordinator.data_dir == "" and set(coordinator.settings["data"]) == {"owned", "classes"}
    c = cluster(coordinator.to_json())
    server = c.server(env={"LORM_DATA_DIR": ""})  # no data anywhere in its reach
    server.wait_for("serving on")
    own = {
        0: ["--data", str(folder / "client0.csv"), "--test-data", str(folder / "client0-test.csv")],
        1: ["--data", str(folder / "client1.csv")],  # no test split: it evaluates nothing
        2: ["--data", str(folder / "client2.csv"), "--test-data", str(folder / "client2-test.csv")],
    }
    clients = [c.client(i, *own[i], env={"LORM_DATA_DIR": ""}) for i in range(3)]
    assert server.wait(timeout=300) == 0, "".join(server.lines[-30:])
    assert all(p.wait() == 0 for p in clients)

    logs = ["".join(p.lines) for p in clients]
    assert "shard sizes per task [12, 0]" in logs[1]  # none of task 1's classes, and it took part
    assert "shard sizes per task [0, 12]" in logs[2]
    left_out = [line for line in clients[2].lines if "in no task of the run" in line]
    assert len(left_out) == 1 and "6 samples" in left_out[0] and "'timer' (6)" in left_out[0]
    assert "in no task of the run" not in logs[0] + logs[1]

    results = c.run_dir / "results"
    metrics = json.loads((results / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert all(total > 0 for row in metrics["total"] for total in row)  # clients 0 and 2 evaluated every task
    for name in ("adapter/adapter_model.safetensors", "head.safetensors"):
        want, got = load_file(str(out / name)), load_file(str(results / name))
        assert got.keys() == want.keys()
        for key in want:
            assert torch.equal(got[key], want[key]), (name, key)
    card = json.loads((results / "model.json").read_text())
    assert card["classes"] == ["alarm", "balance", "greeting", "music"]
    for t in range(2):  # the export after each task, the engine's and the coordinator's alike
        task, engine_task = results / f"task-{t}", out / f"task-{t}"
        assert json.loads((task / "model.json").read_text()) == json.loads((engine_task / "model.json").read_text())
        want, got = load_file(str(engine_task / "head.safetensors")), load_file(str(task / "head.safetensors"))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), t
    assert RunConfig.from_json((results / "config.json").read_text()).to_json() == coordinator.to_json()
