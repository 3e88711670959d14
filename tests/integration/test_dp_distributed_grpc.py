"""Distributed DP over gRPC: three client processes add their discrete Gaussian shares before masking, and
the run equals the in-process distributed-DP run with the same ``dp.seed``, bit for bit."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_secagg_grpc import secure_config, started_ready

from common.privacy.gaussian import calibrate
from common.run.settings import DpSettings
from engine.simulation import run_inprocess

DISTRIBUTED = {"dp": {"epsilon": 1.0, "clip": 2.0, "seed": 5, "mode": "distributed"}}
HOSTILE = Path(__file__).with_name("hostile_coordinator.py")


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
    features = [(h["task"], h["round"], h["phase"]) for h in metrics["history"] if h["phase"] == "features"]
    for i in range(3):  # each client wrote down, before revealing, the one session of each step whose sum is out
        masked = json.loads((c.run_dir / f"ledger-{i}.json").read_text())["masked"]
        assert sorted(tuple(m[2:5]) for m in masked) == sorted(features) and all(m[5] == 0 for m in masked)


@pytest.mark.slow  # the same statement for a dropped client is checked on the coordinator's own path in
# tests/server/test_closed_form_dp_distributed.py; this one kills a real process (20 s)
def test_a_dropped_clients_missing_share_is_stated_for_the_survivors(cluster):
    """Client 1 is killed after its keys and shares went out: the two survivors' sum (the threshold) carries exactly
    the calibrated variance, at least the Gaussian's sigma^2, and its epsilon is the budget's."""
    config = secure_config(num_clients=3, num_tasks=1, rounds_per_task=1, method="ridge", settings=DISTRIBUTED)
    c = cluster(config.to_json())
    server = c.server("--round-deadline", "6", "--quorum", "2")
    server.wait_for("serving on")
    clients = started_ready(c, kill=(1,))
    assert server.wait() == 0
    assert [clients[i].wait() for i in range(3)] == [0, -9, 0]
    step = json.loads((c.run_dir / "results" / "metrics.json").read_text())["history"][0]
    assert step["secagg"]["survivors"] == 2 and step["dp"]["survivors"] == 2
    gaussian = calibrate(DpSettings(**DISTRIBUTED["dp"]), ("gram", "class_sum"))
    assert all(step["dp"]["variance"][name] >= gaussian[name].sigma ** 2 for name in gaussian)
    assert abs(step["dp"]["epsilon"] - 1.0) < 1e-3


def test_no_client_masks_a_second_session_of_a_step_whose_noised_sum_was_unmasked(cluster):
    """A hostile coordinator process unmasks the first step's sum and then claims the session failed, restarting it
    with fresh keys: a second sum of the same statistics with fresh noise shares would average the noise down. Each
    client wrote the session down before revealing, and sits the new one out: it advertises no keys, so the
    restarted session never gets a roster, and nothing more of the step leaves any client."""
    config = secure_config(method="ridge", num_tasks=1, settings=DISTRIBUTED)
    c = cluster(config.to_json())
    server = c.server("--round-deadline", "5", program=(str(HOSTILE),))
    server.wait_for("serving on")
    clients = [c.client(i) for i in range(3)]
    server.wait_for("hostile: unmasked")
    server.wait_for(r"restarted with fresh keys \(attempt 1\)")
    for p in clients:
        p.wait_for(r"\(session 1\): a secure session over the same inputs reached an unmask request")
    for i in range(3):
        masked = json.loads((c.run_dir / f"ledger-{i}.json").read_text())["masked"]
        assert [m[5] for m in masked] == [0]  # the first session only
    (state,) = (c.run_dir / "state").rglob("secagg.json")
    session = json.loads(state.read_text())
    assert session["attempt"] == 1 and session["session"]["keys"] == {} and session["session"]["roster"] is None
