"""Distributed DP over gRPC (issue 44): three client processes add their Skellam shares before masking, and the
run equals the in-process distributed-DP run with the same ``dp.seed``, bit for bit."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file
from test_secagg_grpc import secure_config

from engine.simulation import run_inprocess

DISTRIBUTED = {"dp": {"epsilon": 1.0, "clip": 2.0, "seed": 5, "mode": "distributed"}}


def test_a_distributed_dp_run_over_grpc_is_the_in_process_run(cluster, tmp_path):
    """Ridge, two tasks, three clients: the shares (keyed by the seed, the step's context and the client's index)
    are the same in each process as in the in-process engine, and ring sums do not depend on arrival order, so
    the head, the accuracy and the privacy statement are identical."""
    config = secure_config(method="ridge", num_tasks=2, settings=DISTRIBUTED)
    c = cluster(config.to_json())
    server = c.server()
    server.wait_for("serving on")
    clients = [c.client(i) for i in range(3)]
    result = run_inprocess(config, results_dir=tmp_path)  # while the processes import
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    got, want = (
        load_file(str(c.run_dir / "results" / "head.safetensors")),
        load_file(str(tmp_path / "head.safetensors")),
    )
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert metrics["correct"] == result.matrix.correct and metrics["total"] == result.matrix.total
    assert metrics["privacy"] == json.loads(json.dumps(result.summary()["privacy"]))
    assert metrics["privacy"]["mode"] == "distributed" and len(metrics["privacy"]["steps"]) == 2
    assert "dp_mode distributed" in "".join(server.lines)
