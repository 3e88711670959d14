"""Secure aggregation on the sparse graph over real processes: many clients hosted in a few ``lorm-client
--sessions`` processes, each client over its own mTLS channel with its own certificate, signed mode, a tenth of
them gone after sharing their keys (their process SIGKILLed at its first masked input).

The reference is the in-process engine on the same configuration with the same clients dropping out after the
share round: the sparse graph is drawn from the step's context on both sides, the survivors' masked inputs are
exact ring sums in any order, so the heads written are bit-identical."""

from __future__ import annotations

import json

import pytest
from safetensors.torch import load_file

from common.run.config import RunConfig
from engine.dropouts import drops_after_sharing
from engine.simulation import run_inprocess

HOSTS = 3  # processes of surviving clients; one more holds the clients that drop out


def sparse_config(n: int) -> RunConfig:
    return RunConfig(
        run_id="sparse",
        num_clients=n,
        num_tasks=1,
        rounds_per_task=1,
        method="ridge",
        threads=1,
        seed=9,
        extra={"synthetic_classes": 8, "synthetic_train": 4 * n, "synthetic_test": 10},
        settings={"secagg": {"enabled": True, "graph": "sparse", "mode": "signed"}},
    )


def run_sparse(cluster, tmp_path_factory, n: int) -> None:
    config = sparse_config(n)
    gone = list(range(n - n // 10, n))  # the last tenth: random places on the graph's ring
    out = tmp_path_factory.mktemp("reference")
    # Rounds wait this long for the clients that dropped only: every other round closes when all have answered. A
    # round that closes at its deadline leaves out every live client still computing, so the deadline must exceed
    # the whole population's share round: at 200 signed clients in threads of one process on two cores, 10 s left
    # 16 out of the share round and the step made no progress for 15 minutes (stopped by hand)
    slow = n > 40
    run_inprocess(config, results_dir=out, sessions=drops_after_sharing(set(gone)), deadline_s=60.0 if slow else 5.0)
    c = cluster(config.to_json())
    # a round closes past the deadline with the survivors; the evaluation then closes with theirs
    # long enough for every live client's share and answer, however loaded the machine: a hosted process builds its
    # sessions' shards one at a time, and a session that has not shared by the deadline leaves the step early
    deadline = "60" if slow else "20"
    server = c.server("--round-deadline", deadline, "--quorum", str(n - len(gone)))
    server.wait_for("serving on")
    per = -(-(n - len(gone)) // HOSTS)
    hosts = [c.hosted(first, min(per, gone[0] - first)) for first in range(0, gone[0], per)]
    # killed at its first masked input: after the share round closed, so each of its clients has shared by then
    # (at its first result, "client.push", the others of the process may still be sharing: they then drop before)
    dropping = c.hosted(gone[0], len(gone), env={"LORM_FAULT": "client.masked:1"})
    assert server.wait(timeout=900) == 0
    assert [h.wait(timeout=60) for h in hosts] == [0] * len(hosts) and dropping.wait(timeout=60) == -9
    first = json.loads((c.run_dir / "results" / "metrics.json").read_text())["history"][0]["secagg"]
    assert first["survivors"] == n - len(gone) and first["dropped"] == gone
    assert first["graph"] == "sparse" and first["neighbours"] < n - 1
    ours = load_file(str(c.run_dir / "results" / "head.safetensors"))
    theirs = load_file(str(out / "head.safetensors"))
    assert ours.keys() == theirs.keys() and all(ours[k].equal(theirs[k]) for k in ours)


@pytest.mark.slow  # minutes: 200 clients, each building its model, signing and verifying its neighbourhood's keys
def test_two_hundred_clients_in_four_processes_signed_sparse_a_tenth_gone(cluster, tmp_path_factory):
    run_sparse(cluster, tmp_path_factory, 200)


@pytest.mark.slow  # under a minute alone, but beside the suite's other work it is one of its longest tests
def test_twenty_clients_in_four_processes_signed_sparse_a_tenth_gone(cluster, tmp_path_factory):
    run_sparse(cluster, tmp_path_factory, 20)
