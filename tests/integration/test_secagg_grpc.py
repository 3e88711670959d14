"""Secure aggregation over gRPC (issue 19): coordinator and clients as processes on loopback.

Ring sums do not depend on the order inputs arrive, so a secure run over the wire is bit-identical
to the same secure run in process; clients killed after sharing their keys leave the survivors'
sums; the coordinator's state directory and log never hold one client's unmasked terms."""

from __future__ import annotations

import json
import time

import numpy as np
import torch
from safetensors.torch import load_file
from test_distributed import CONFIG, same_counts_and_head

from client.runtime import build_runtime
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
from common.secagg.primitives import encode
from common.secagg.terms import Layout, client_terms, fixed_point
from common.wire.messages import Phase
from server.strategies import make_strategy

SECURE = {"secagg": {"enabled": True}}


def secure_config(**kw) -> RunConfig:
    values = json.loads(CONFIG.to_json())
    values["settings"] = values["settings"] | SECURE | kw.pop("settings", {})
    return RunConfig(**{**values, "run_id": "secure", **kw})


def test_secure_run_over_grpc_is_identical_to_the_secure_run_in_process(cluster, tmp_path):
    config = secure_config(method="lorm", num_tasks=1)  # a B-round, an A-round, the task Gram
    c, server, metrics = same_counts_and_head(cluster, config, tmp_path)
    name = "adapter/adapter_model.safetensors"
    got, want = load_file(str(c.run_dir / "results" / name)), load_file(str(tmp_path / name))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    steps = [h for h in metrics["history"] if h["phase"] != "evaluate"]
    assert steps and all(h["secagg"]["survivors"] == 3 for h in steps)
    assert "secure sum of 3 clients" in "".join(server.lines)


def test_clients_killed_after_sharing_leave_the_survivors_sum(cluster):
    """5 clients, threshold 3: clients 1 and 3 are killed in the first step after their keys and shares
    went out, before their masked input. Past the deadline the coordinator closes the inputs with the
    three survivors, unmasks with their answers, and the run finishes on them. The unmasked sum counts
    exactly the survivors' samples (an exact integer sum over the wire)."""
    config = secure_config(num_clients=5, num_tasks=1, rounds_per_task=1)
    c = cluster(config.to_json())
    # Every client must be in the step's roster, which closes at the deadline with the threshold: 15 s
    # covers five processes starting on a loaded machine (with 5 s, a late client could be left out, and
    # the step, two of its three sharers killed, would restart instead).
    server = c.server("--round-deadline", "15", "--quorum", "3")
    server.wait_for("serving on")
    kill = {"LORM_FAULT": "client.push:1"}
    clients = [c.client(i, env=kill if i in (1, 3) else None) for i in range(5)]
    assert server.wait() == 0
    assert [p.wait() for p in clients] == [0, -9, 0, -9, 0]
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    first = metrics["history"][0]["secagg"]
    assert first["survivors"] == 3 and first["dropped"] == [1, 3]
    runtime = build_runtime(config)
    shard = {i: int(runtime.worker(i, f"client-{i}").shards[0].numel()) for i in range(5)}
    assert first["samples"] == shard[0] + shard[2] + shard[4] < sum(shard.values())
    assert "roster of 5 clients" in "".join(server.lines)
    assert "masked inputs of 3 clients, dropped [1, 3]" in "".join(server.lines)


def _words(values: np.ndarray, width: int) -> set[bytes]:
    """Every aligned ``width``-byte word of ``values`` with at most a quarter of its bytes zero: the
    distinctive ones (a word of mostly zero bytes turns up in any file by chance)."""
    raw = values.tobytes()
    words = (raw[k : k + width] for k in range(0, len(raw), width))
    return {w for w in words if w.count(0) <= width // 4}


def test_the_coordinators_state_and_log_hold_no_individual_term(cluster):
    """The coordinator is stopped right after the first unmask answer of the first step is persisted:
    every byte under its state directory (staged masked inputs, the session) and its log holds none of
    any client's terms of that step, neither as a fixed-point ring element nor as a float64."""
    config = secure_config(method="lorm", num_tasks=1, rounds_per_task=1)
    c = cluster(config.to_json())
    server = c.server(env={"LORM_FAULT": "secagg.revealed:1:stop"})
    server.wait_for("serving on")
    clients = [c.client(i) for i in range(3)]
    deadline = time.monotonic() + 120
    while not server.stopped() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert server.stopped()
    stored = b"".join(p.read_bytes() for p in sorted((c.run_dir / "state").rglob("*")) if p.is_file())
    assert list((c.run_dir / "state").rglob("secagg.json")) and list((c.run_dir / "state").rglob("*.safetensors"))
    server.resume()
    assert server.wait() == 0 and all(p.wait() == 0 for p in clients)
    stored += "".join(server.lines).encode()
    runtime = build_runtime(config)
    strategy = make_strategy(config, runtime.spec)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    fp = fixed_point(SecAggSettings(enabled=True), 3)
    checked = 0
    for i in range(3):
        update = runtime.worker(i, f"client-{i}").handle(plan)
        terms = client_terms(strategy.aggregator(plan), update)
        flat = Layout.of(terms).flatten(terms)
        for words in (_words(encode(flat, fp), 16), _words(flat, 8)):  # ring elements; float64
            assert words and not any(w in stored for w in words), i
            checked += len(words)
    assert checked > 100


def test_a_secure_step_below_the_threshold_restarts_when_a_client_comes_back(cluster):
    """5 clients, threshold 3: clients 1, 2 and 3 are killed after their keys and shares went out, so
    at most two masked inputs can ever arrive. Client 2 is started again: it has lost its keys, cannot
    take part in that session, and asks to. The coordinator restarts the step's secure aggregation
    with fresh keys (attempt 1); clients 0 and 4 mask the result they kept (or train, had they been
    late for the first roster), client 2 trains, and the sum of exactly those three is unmasked; the
    run finishes on them."""
    config = secure_config(num_clients=5, num_tasks=1, rounds_per_task=1)
    c = cluster(config.to_json())
    server = c.server("--round-deadline", "5", "--quorum", "3")
    server.wait_for("serving on")
    # The clients to be killed (at their first push) are ready before the step opens, so they are in its
    # roster whatever the load; clients 0 and 4 start after them (if late for the roster, they ask too).
    kill = {"LORM_FAULT": "client.push:1"}
    clients = {i: c.client(i, env=kill) for i in (1, 2, 3)}
    for i in (1, 2, 3):
        clients[i].wait_for("model: ")
    clients |= {i: c.client(i) for i in (0, 4)}
    assert [clients[i].wait() for i in (1, 2, 3)] == [-9, -9, -9]
    again = c.client(2)
    assert server.wait() == 0
    assert [clients[i].wait() for i in (0, 4)] == [0, 0] and again.wait() == 0
    log = "".join(server.lines)
    assert "ask to take part: restarted with fresh keys (attempt 1)" in log
    first = json.loads((c.run_dir / "results" / "metrics.json").read_text())["history"][0]["secagg"]
    assert first["attempt"] == 1 and first["survivors"] == 3 and first["dropped"] == []
    runtime = build_runtime(config)
    shard = {i: int(runtime.worker(i, f"client-{i}").shards[0].numel()) for i in range(5)}
    assert first["samples"] == shard[0] + shard[2] + shard[4]
