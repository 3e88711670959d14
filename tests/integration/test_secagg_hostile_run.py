"""Secure aggregation, honest mode, against a hostile client and a killed coordinator, over real
processes: three honest ``lorm-client`` s and a hostile fourth (``hostile_client.py``) with mTLS certificates
of a dev CA, the coordinator SIGKILLed inside a secure step and started again on its state directory.

The hostile client takes part in every session's keys and shares. In training round 0 it sends an
honest masked input and answers the unmask request with wrong shares: the spare answers name it, it is
excluded from the step, and the session restarts without it (the coordinator is killed right after that
restart is persisted, and resumes it). In round 1 it masks random ring elements: the unmasked sum is out of
the fixed point's range, nobody can be named, and the session restarts, where it drops out. In round 2 (the
task Gram) it drops out after sharing. It evaluates honestly.

The reference: the in-process engine on the same configuration (four clients, the same seed, hence the same
shards, the same threshold and fixed point), client 3 dropping out after the share round of every secure
step. Each step's final session then unmasks the ring sum of the same three encoded inputs (exact integer
sums, in any order), decoded for the same three clients: the merges see bit-identical sums, so the result
is bit-identical, not merely within ``FixedPoint.error_bound``. That is the clean run of the three honest
clients on their own shards; client 3's shard only enters its evaluation of the merged model (its test
share), which is the same in both runs.

Four clients are the fewest for all of it: the threshold of four is three, so the liar's answer in round
0 is one more than the threshold (the spare that names it), and the three honest clients reach the threshold
without it (six, threshold five, would test the same at the cost of two more client processes)."""

from __future__ import annotations

import json
import math
import signal
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from common.run.config import RunConfig
from engine.dropouts import drops_after_sharing
from engine.simulation import run_inprocess

from procs import ProjectProc

HOSTILE = 3  # the last client's index: clients 0..2 are honest
WRONG_SHARE, GARBAGE = 0, 1  # the training rounds whose first session the hostile client spoils
CONFIG = RunConfig(
    run_id="hostile",
    num_clients=4,
    num_tasks=1,
    rounds_per_task=2,  # train B (round 0), train A (round 1), the task Gram (round 2), the evaluation
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=9,
    extra={"synthetic_classes": 8, "synthetic_train": 30, "synthetic_test": 10},
    # the honest mode (threshold n/2 + 1 = 3): in the signed mode a client never masks a step's inputs again once it
    # has answered its unmask request (a deviating coordinator could restart without any victim it names), so the
    # restart after the liar's round 0 would get no honest client
    settings={"secagg": {"enabled": True}},
)
# Each round a dropping client leaves open waits this long before closing with the threshold; a round the
# hostile client takes part in closes as soon as all four have sent. An honest client left out of round 0's
# first session would spoil the test: a roster or inputs of three, the liar among them, leave no spare answer
# to name it, and a late client asking to take part restarts the session before the liar reveals. So every
# client is ready before the run starts (below), and each round then needs a second or two of work (a
# training epoch of a tiny model, signatures), even with the machine's two cores shared by many processes.
DEADLINE_S = "6"
RESULTS = ("adapter/adapter_model.safetensors", "head.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run with the hostile client's index dropping out of every secure step after sharing."""
    out = tmp_path_factory.mktemp("reference")
    result = run_inprocess(CONFIG, results_dir=out, sessions=drops_after_sharing(HOSTILE), deadline_s=1.0)
    return result, {name: load_file(str(out / name)) for name in RESULTS}


def no_nan(value: float | None) -> float | None:
    """A loss as metrics.json writes it: NaN (a step that trains nothing) as null."""
    return None if value is None or math.isnan(value) else value


def hostile_client(c, hostile: int = HOSTILE) -> ProjectProc:
    pki = c.pki
    p = ProjectProc(
        "hostile",
        [
            sys.executable,
            str(Path(__file__).with_name("hostile_client.py")),
            "--server",
            f"127.0.0.1:{c.port}",
            "--client-id",
            f"client-{hostile}",
            "--index",
            str(hostile),
            "--tls-ca",
            str(pki.ca),
            "--tls-cert",
            str(pki.client_cert(f"client-{hostile}")),
            "--tls-key",
            str(pki.client_key(f"client-{hostile}")),
            "--wrong-share",
            str(WRONG_SHARE),
            "--garbage",
            str(GARBAGE),
        ],
    )
    c.procs.append(p)
    return p


@pytest.mark.long(20)
def test_a_hostile_client_and_a_killed_coordinator_leave_the_clean_runs_result(cluster, reference):
    c = cluster(CONFIG.to_json())

    def honest_clients() -> list[tuple[ProjectProc, int]]:
        return [(c.client(i), 1) for i in range(HOSTILE)]

    attacked_and_killed(c, reference, honest_clients, HOSTILE, DEADLINE_S)


def attacked_and_killed(c, reference, honest_clients, hostile_index: int, deadline: str) -> None:
    """The run of cluster ``c`` with the honest clients (``honest_clients()`` starts their processes and says how
    many clients each holds) and the hostile client ``hostile_index``, the coordinator killed at round 0's restart
    and started again: the clean run's result (``reference``) and the history of the attacks."""
    expected, files = reference
    server = c.server("--round-deadline", deadline, env={"LORM_FAULT": "secagg.restarted:1"})
    server.wait_for("serving on")
    # The run starts at the first Describe once all clients have joined, and round 0's keys round is timed from
    # then. A client builds its model between its Join and its Describe (a minute on a loaded machine), so
    # the honest clients join and describe first, the run waiting for the last; the hostile client's
    # Describe then starts it with every client polling for its plan.
    started = honest_clients()
    honest = [p for p, _ in started]
    for p, count in started:
        for _ in range(count):  # each of the process's clients has built its model
            p.wait_for("model: ", timeout=300)
    hostile = hostile_client(c, hostile_index)
    # Killed once round 0's restart (without the liar) is on disk, its abandoned masked inputs still staged.
    server.wait_for(r"LORM_FAULT: SIGKILL at secagg.restarted \(hit 1\)", timeout=300)
    assert server.wait(timeout=30) == -signal.SIGKILL
    first_log = "".join(server.lines)
    assert (
        f"task 0 step 0 secure aggregation (attempt 0) failed: client {hostile_index}: revealed a wrong share of client"
        in first_log
    )
    assert f"excluding clients [{hostile_index}] from the step" in first_log
    restarted = c.server("--round-deadline", deadline, "--linger", "60")
    restarted.wait_for(rf"resumed run {json.loads(c.config.read_text())['run_id']} at running task 0 step 0")
    assert restarted.wait(timeout=300) == 0
    assert [p.wait(timeout=60) for p in honest] == [0] * len(honest)
    assert hostile.wait(timeout=30) == 0
    said = "".join(hostile.lines)
    # The coordinator was killed inside the call that completed round 0's reveals. When that call was the liar's
    # own, its retry reached the restarted coordinator, already in attempt 1: ABORTED, not "sent".
    assert "round 0 attempt 0: revealing wrong shares" in said and "round 1 attempt 0: sent garbage input" in said
    assert "round 1 attempt 1: keys and shares sent, dropping out" in said
    assert "round 2 attempt 0: keys and shares sent, dropping out" in said

    # The result: bit-identical tensors and the same accuracy counts as the reference.
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert (metrics["correct"], metrics["total"]) == (expected.matrix.correct, expected.matrix.total)
    for name, want in files.items():
        got = load_file(str(c.run_dir / "results" / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name

    # The history: each step's final session unmasked the three honest clients' sum; the spoiled ones restarted.
    history, clean = metrics["history"], expected.history
    assert [h["phase"] for h in history] == [h["phase"] for h in clean] == ["train", "train", "task_gram", "evaluate"]
    for got, want in zip(history[:3], clean[:3]):
        assert got["secagg"]["survivors"] == want["secagg"]["survivors"] == hostile_index  # the honest, 0 .. liar - 1
        assert got["secagg"]["samples"] == want["secagg"]["samples"] and no_nan(got["loss"]) == no_nan(want["loss"])
    wrong, garbage, gram = (h["secagg"] for h in history[:3])
    assert wrong["attempt"] == 1 and wrong["dropped"] == []  # the liar was kept out of the restarted session
    assert (
        list(wrong["excluded"]) == [str(hostile_index)]
        and "revealed a wrong share" in wrong["excluded"][str(hostile_index)]
    )
    assert len(wrong["failed"]) == 1 and wrong["failed"][0].startswith(
        f"Culprits: client {hostile_index}: revealed a wrong"
    )
    assert garbage["attempt"] == 1 and garbage["dropped"] == [hostile_index] and "excluded" not in garbage
    assert len(garbage["failed"]) == 1 and "an unmasked sum lies beyond" in garbage["failed"][0]
    assert gram["attempt"] == 0 and gram["dropped"] == [hostile_index] and "failed" not in gram
    second_log = "".join(restarted.lines)
    assert "task 0 step 1 secure aggregation (attempt 0) failed" in second_log and "nobody can be named" in second_log
    assert "task 0 step 1 secure aggregation (attempt 0): restarted with fresh keys (attempt 1)" in second_log


SPARSE_N = 16  # the fewest the sparse graph serves at its defaults: k 8 neighbours, threshold 6 in each neighbourhood
SPARSE = CONFIG.replace(
    run_id="hostile-sparse",
    num_clients=SPARSE_N,
    extra={**CONFIG.extra, "synthetic_train": 8 * SPARSE_N},
    settings={"secagg": {"enabled": True, "graph": "sparse"}},
)


@pytest.fixture(scope="module")
def sparse_reference(tmp_path_factory):
    out = tmp_path_factory.mktemp("sparse-reference")
    drops = drops_after_sharing(SPARSE_N - 1)
    result = run_inprocess(SPARSE, results_dir=out, sessions=drops, deadline_s=5.0)
    return result, {name: load_file(str(out / name)) for name in RESULTS}


@pytest.mark.slow  # minutes: sixteen clients training in three processes, a coordinator killed and started again
def test_on_the_sparse_graph_a_hostile_client_and_a_killed_coordinator_leave_the_clean_result(
    cluster, sparse_reference
):
    """The same attacks on a sparse graph (each client's shares and masks with its 8 neighbours only): the liar's
    wrong shares are named by the spare answers of the neighbourhoods it answers for, the garbage input cannot be
    named, and each step's final session is the honest fifteen's sum, bit for bit the in-process run's."""
    c = cluster(SPARSE.to_json())
    half = (SPARSE_N - 1) // 2

    def honest_clients() -> list[tuple[ProjectProc, int]]:
        return [(c.hosted(0, half), half), (c.hosted(half, SPARSE_N - 1 - half), SPARSE_N - 1 - half)]

    attacked_and_killed(c, sparse_reference, honest_clients, SPARSE_N - 1, "20")
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    first = metrics["history"][0]["secagg"]
    assert first["graph"] == "sparse" and first["neighbours"] < SPARSE_N - 1
