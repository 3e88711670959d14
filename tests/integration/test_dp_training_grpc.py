"""DP-SGD and LoRM's private Grams over gRPC with secure aggregation: three client processes train with
DP-SGD and noise their Grams before masking, and the run equals the in-process run with the same seeds, bit for bit
(the batches come from the step's seed, the noise from dp.seed, and ring sums do not depend on arrival order)."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file
from test_secagg_grpc import secure_config

from engine.simulation import run_inprocess

PRIVATE = {"dp": {"epsilon": 8.0, "mode": "local", "seed": 5, "sample_rate": 0.2}}


@pytest.mark.long(17)
def test_a_private_lorm_run_over_grpc_with_secure_aggregation_is_the_in_process_run(cluster, tmp_path):
    config = secure_config(method="lorm", num_tasks=2, settings=PRIVATE)
    c = cluster(config.to_json())
    server = c.server()
    server.wait_for("serving on")
    clients = [c.client(i) for i in range(3)]
    result = run_inprocess(config, results_dir=tmp_path)  # while the processes import
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    for name in ("head.safetensors", "adapter/adapter_model.safetensors"):
        got, want = load_file(str(c.run_dir / "results" / name)), load_file(str(tmp_path / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert metrics["privacy"] == json.loads(json.dumps(result.summary()["privacy"]))
    assert metrics["privacy"]["mode"] == "local" and abs(metrics["privacy"]["epsilon"] - 8.0) < 8e-3
    steps = [h for h in metrics["history"] if h["phase"] != "evaluate"]
    assert all(h["secagg"]["survivors"] == 3 and "dp_epsilon" in h for h in steps)
    assert "dp_epsilon" in "".join(server.lines)
    plan = {"rounds": config.rounds_per_task, "grams": config.rounds_per_task + 1}
    for i in range(3):  # each client's own account: every task's records through exactly the plan
        (run,) = json.loads((c.run_dir / f"ledger-{i}.json").read_text())["runs"].values()
        assert run["run_id"] == config.run_id and run["grams"] is True
        assert run["released"] == {str(t): [plan["rounds"], plan["grams"]] for t in range(config.num_tasks)}
