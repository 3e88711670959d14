"""Crash consistency and stalls with real processes on loopback.

The coordinator is SIGKILLed at one named step of the protocol (``common.infra.faults``), started
again on the same state directory, and the run must finish with results bit-identical to a
fault-free run of the same configuration (the in-process engine, which the distributed run
equals: ``test_distributed.py``). A stalled client (SIGSTOP) must not block a round once
the quorum is met; its late update is refused and it takes part in the next round.
"""

from __future__ import annotations

import json
import signal
import struct

import pytest

from common.run.config import RunConfig
from engine.simulation import run_inprocess

CONFIG = RunConfig(
    run_id="faults",
    num_clients=2,
    num_tasks=2,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=5,
    extra={"synthetic_classes": 8, "synthetic_train": 20, "synthetic_test": 8},
)
RESULT_FILES = ("adapter/adapter_model.safetensors", "head.safetensors")

# Per task the steps are: train B, train A, task Gram, evaluate; 2 clients push at each of the
# first three and report at the fourth. Commits: 1 at start-up, 1 per join, 1 for the model
# description, 1 when the run starts (5), then 1 per step. ``nth`` picks the hit to kill at.
POINTS = [
    pytest.param("push.receiving:3", id="streaming-push"),  # task 0 round 1, the first push, mid-stream
    pytest.param("push.staged:4", id="staged-not-acked", marks=pytest.mark.slow),  # the push that closes round 1
    pytest.param("merge.fold:3", id="merge-fold", marks=pytest.mark.slow),  # round 1, the first fold
    pytest.param("merge.aggregated:2", id="merge-aggregated"),  # round 1 merged in memory, not committed
    pytest.param("commit.tensors:7", id="commit-tensors-written"),  # round 1's generation: tensors, no meta
    pytest.param("commit.current:9", id="commit-renamed", marks=pytest.mark.slow),  # task 0 evaluated: CURRENT moved
    pytest.param("join.committed:2", id="join-committed", marks=pytest.mark.slow),  # second join, not answered
    pytest.param("eval.staged:2", id="eval-staged", marks=pytest.mark.slow),  # the report that closes task 0
    pytest.param("export:1", id="task-export", marks=pytest.mark.slow),  # task 0's adapter written, head and card not
    pytest.param("export:3", id="export", marks=pytest.mark.slow),  # the final adapter written (after tasks 0 and 1's)
]


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The fault-free run of CONFIG: its result files and accuracy counts."""
    out = tmp_path_factory.mktemp("reference")
    result = run_inprocess(CONFIG, results_dir=out)
    return {name: (out / name).read_bytes() for name in RESULT_FILES}, result.matrix


def safetensors_parts(raw: bytes) -> tuple[dict, bytes]:
    """A safetensors file's header (names, dtypes, shapes, offsets, metadata) and its data bytes.

    Compared as parsed JSON: the library writes the metadata's keys in hash order, which
    differs between processes, so two equal files need not be equal byte for byte."""
    size = struct.unpack("<Q", raw[:8])[0]
    return json.loads(raw[8 : 8 + size]), raw[8 + size :]


def assert_same_as_reference(run_dir, reference) -> None:
    files, matrix = reference
    metrics = json.loads((run_dir / "results" / "metrics.json").read_text())
    assert (metrics["correct"], metrics["total"]) == (matrix.correct, matrix.total)
    for name, expected in files.items():
        header, data = safetensors_parts((run_dir / "results" / name).read_bytes())
        want_header, want_data = safetensors_parts(expected)
        assert header == want_header, name
        assert data == want_data, f"{name}: tensor bytes differ from the fault-free run"
    for task in range(CONFIG.num_tasks):  # each task's export is whole, whatever the crash cut short
        assert (
            json.loads((run_dir / "results" / f"task-{task}" / "model.json").read_text())["tasks_trained"] == task + 1
        )


@pytest.mark.parametrize("fault", POINTS)
def test_coordinator_killed_at_point_resumes_bit_identical(cluster, reference, fault):
    c = cluster(CONFIG.to_json())
    name, nth = fault.split(":")
    server = c.server(env={"LORM_FAULT": fault})
    server.wait_for("serving on")
    clients = [c.client(i) for i in range(CONFIG.num_clients)]
    server.wait_for(rf"LORM_FAULT: SIGKILL at {name} \(hit {nth}\)", timeout=300)  # slow on a busy machine
    assert server.wait(timeout=30) == -signal.SIGKILL
    # Same state dir and port, no fault; clients redial with backoff. It exits once every
    # client has learnt that the run is over, so a long linger costs nothing.
    restarted = c.server("--linger", "60")
    restarted.wait_for(r"resumed run faults at")
    assert restarted.wait(timeout=300) == 0
    assert [p.wait(timeout=60) for p in clients] == [0] * CONFIG.num_clients
    assert_same_as_reference(c.run_dir, reference)


@pytest.mark.long(16)
def test_stalled_client_does_not_block_the_quorum_and_rejoins(cluster):
    c = cluster(CONFIG.to_json())
    server = c.server("--quorum", "1", "--round-deadline", "12")  # time for the resumed client to make round 1
    server.wait_for("serving on")
    fast = c.client(0)
    stalled = c.client(1, env={"LORM_FAULT": "client.push:1:stop"})  # stops before its first push
    stalled.wait_for(r"LORM_FAULT: SIGSTOP at client.push", timeout=300)  # slow on a busy machine
    server.wait_for(r"task 0 step 0 deadline passed: closing without clients \[1\]", timeout=60)
    stalled.proc.send_signal(signal.SIGCONT)
    refused = stalled.wait_for(r"update refused", timeout=60)
    assert "FAILED_PRECONDITION" in refused and "task 0 round 1" in refused  # its round 0 came too late
    assert server.wait(timeout=300) == 0
    assert fast.wait(timeout=60) == 0 and stalled.wait(timeout=60) == 0
    history = json.loads((c.run_dir / "results" / "metrics.json").read_text())["history"]
    assert [h["clients"] for h in history[:2]] == [1, 2]  # round 0 without it; round 1 with it again
    assert len(history) == 8  # every step of both tasks closed
