"""Secure aggregation against a client that attacks the keys and the boxes (H4), over real processes: three
honest ``lorm-client`` s and a hostile fourth (``hostile_keys_client.py``), mTLS certificates of a dev CA, the
honest mode (threshold 3 of 4).

In training round 0 the hostile client advertises a low-order mask key: the coordinator refuses it at advertise
(before, every honest client's exchange with that key raised and each client process exited), the keys round
closes at its deadline with the three honest clients, and their sum is merged. In round 1 it sends client 0 a
box of random bytes, then masks its honest update and answers honestly: client 0 answers without that share and
complains, revealing that pair's box key (before, its reveal raised); the hostile client's own share and the two
other honest clients' rebuild its seed, the sum of all four is exact, and the coordinator names the hostile
client in the history. In the task Gram it drops out after sharing.

The reference: the in-process engine on the same configuration, client 3 dropping out after the share round of
round 0 and of the task Gram and taking part in round 1; each step unmasks the ring sum of the same encoded
inputs, so the result is bit-identical (``test_secagg_hostile_run.py``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from safetensors.torch import load_file

from common.run.config import RunConfig
from common.wire.messages import Phase
from engine.dropouts import drops_after_sharing
from engine.simulation import run_inprocess

from procs import ProjectProc

HOSTILE = 3
LOW_ORDER, GARBAGE_BOX = 0, 1
CONFIG = RunConfig(
    run_id="hostile-keys",
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
    settings={"secagg": {"enabled": True}},  # threshold n/2 + 1 = 3
)
DEADLINE_S = "6"  # round 0's keys round, and the task Gram's inputs round, close this long after they open
RESULTS = ("adapter/adapter_model.safetensors", "head.safetensors")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    """The in-process run with the hostile client dropping out after sharing of every secure step but the one whose
    session it spoils with a garbage box (there it takes part to the end)."""
    out = tmp_path_factory.mktemp("reference")
    drops = drops_after_sharing(HOSTILE, lambda plan: not (plan.phase == Phase.TRAIN and plan.round == GARBAGE_BOX))
    result = run_inprocess(CONFIG, results_dir=out, sessions=drops, deadline_s=1.0)
    return result, {name: load_file(str(out / name)) for name in RESULTS}


def hostile_client(c, attacks: tuple[str, ...], index: int = HOSTILE) -> ProjectProc:
    pki, name = c.pki, f"client-{index}"
    p = ProjectProc(
        "hostile",
        [
            sys.executable,
            str(Path(__file__).with_name("hostile_keys_client.py")),
            *("--server", f"127.0.0.1:{c.port}", "--client-id", name, "--index", str(index)),
            *(
                "--tls-ca",
                str(pki.ca),
                "--tls-cert",
                str(pki.client_cert(name)),
                "--tls-key",
                str(pki.client_key(name)),
            ),
            *attacks,
            *("--garbage-box", str(GARBAGE_BOX)),
        ],
    )
    c.procs.append(p)
    return p


def the_clean_result(c: Any, reference) -> dict:
    """``metrics.json`` of cluster ``c``'s run, once its counts and result tensors are the reference's, bit for bit."""
    expected, files = reference
    metrics = json.loads((c.run_dir / "results" / "metrics.json").read_text())
    assert (metrics["correct"], metrics["total"]) == (expected.matrix.correct, expected.matrix.total)
    for name, want in files.items():
        got = load_file(str(c.run_dir / "results" / name))
        assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want), name
    return metrics


def finished(cluster, mode: str, attacks: tuple[str, ...]) -> tuple[Any, list[ProjectProc], str]:
    """A run of ``mode`` with three honest ``lorm-client`` s and the hostile client making round 0's ``attacks``
    (and round 1's garbage box), to its end: every process exits 0 (no honest client exited on the attacks).
    ``(cluster, honest clients, what the hostile client said)``."""
    config = CONFIG.replace(settings=CONFIG.settings | {"secagg": {"enabled": True, "mode": mode}})
    c = cluster(config.to_json())
    server = c.server("--round-deadline", DEADLINE_S, "--linger", "60")
    server.wait_for("serving on")
    honest = [c.client(i) for i in range(HOSTILE)]
    for p in honest:
        p.wait_for("model: ", timeout=300)
    hostile = hostile_client(c, attacks)
    assert server.wait(timeout=300) == 0
    assert [p.wait(timeout=30) for p in honest] == [0] * HOSTILE
    assert hostile.wait(timeout=30) == 0
    return c, honest, "".join(hostile.lines)


@pytest.mark.slow  # 43 s on 2 shared cores: four client processes and a coordinator
@pytest.mark.parametrize("mode", ["honest", "signed"])
def test_a_low_order_key_and_a_garbage_box_leave_every_honest_client_running_and_the_clean_result(
    cluster, reference, mode
):
    """Both modes (the signed mode's threshold of four is three too, so the same sums and the same reference): in the
    signed mode the hostile client's keys are signed by its certificate of the run's CA, its low-order key is
    refused at advertise all the same, and the garbage box's complaint reveals no key (a coordinator that deviates
    could spoil boxes to collect shares), so it is recorded, not judged."""
    c, honest, said = finished(cluster, mode, ("--low-order", str(LOW_ORDER)))
    assert "round 0 attempt 0: low-order key refused (INVALID_ARGUMENT)" in said and "low-order" in said
    assert "round 1 attempt 0: masked input and an honest answer sent" in said
    assert "do not open" in "".join(honest[0].lines)  # client 0 answered without that box, and said so

    metrics = the_clean_result(c, reference)
    low, box, gram = (h["secagg"] for h in metrics["history"][:3])
    assert low["attempt"] == 0 and low["survivors"] == HOSTILE and "failed" not in low
    assert box["attempt"] == 0 and box["survivors"] == HOSTILE + 1 and "failed" not in box
    if mode == "honest":
        assert list(box["blamed"]) == [str(HOSTILE)] and "client 0" in box["blamed"][str(HOSTILE)]
    else:
        assert not box.get("blamed") and str(HOSTILE) in json.dumps(box["complaints"]), box
    assert gram["attempt"] == 0 and gram["dropped"] == [HOSTILE]


@pytest.mark.slow  # about 45 s on 2 shared cores: four client processes and a coordinator
def test_a_dealer_of_wrong_shares_is_proven_and_the_restart_without_it_is_the_clean_result(cluster, reference):
    """The signed mode. In round 0 the hostile client deals shares of another seed than it committed to, masks and
    answers: its seed cannot be rebuilt, and the coordinator names it with the proof its own signatures make. The
    honest clients, who answered that session, check the proof through the blame stage and answer the restart of
    the three of them, which unmasks the same sum as the reference's round 0 (the hostile client dropped there).
    Round 1's garbage box (signed by its dealer) and the task Gram as in the test above."""
    c, _, said = finished(cluster, "signed", ("--bad-deal", str(LOW_ORDER)))
    assert "round 0 attempt 0: dealt shares of another seed than committed" in said
    assert "round 0 attempt 1: keys and shares sent" not in said  # excluded from the restart: never asked again

    metrics = the_clean_result(c, reference)
    deal, box, gram = (h["secagg"] for h in metrics["history"][:3])
    assert deal["attempt"] == 1 and deal["survivors"] == HOSTILE and list(deal["excluded"]) == [str(HOSTILE)]
    assert "its own signatures prove it" in deal["excluded"][str(HOSTILE)]
    assert box["attempt"] == 0 and box["survivors"] == HOSTILE + 1 and "failed" not in box
    assert gram["attempt"] == 0 and gram["dropped"] == [HOSTILE]


# ---------------------------------------------------------------------------- the same attacks on the sparse graph

SPARSE_N = 16  # the fewest the sparse graph serves at its defaults: k 8 neighbours, threshold 6 in each neighbourhood
SPARSE_HOSTILE = SPARSE_N - 1
SPARSE_DEADLINE_S = "20"  # fifteen honest clients in two processes compute in turn: every one shares in time
SPARSE = CONFIG.replace(
    run_id="hostile-keys-sparse",
    num_clients=SPARSE_N,
    extra={**CONFIG.extra, "synthetic_train": 8 * SPARSE_N},
    settings={"secagg": {"enabled": True, "graph": "sparse"}},
)


def sparse_config(mode: str) -> RunConfig:
    return SPARSE.replace(settings={"secagg": SPARSE.settings["secagg"] | {"mode": mode}})


@pytest.fixture(scope="module")
def sparse_reference(tmp_path_factory):
    """Per mode, the in-process sparse run with the hostile client's index dropping out after sharing as above."""
    made = {}

    def of(mode: str):
        if mode not in made:
            out = tmp_path_factory.mktemp(f"sparse-{mode}")
            drops = drops_after_sharing(
                SPARSE_HOSTILE, lambda plan: not (plan.phase == Phase.TRAIN and plan.round == GARBAGE_BOX)
            )
            result = run_inprocess(sparse_config(mode), results_dir=out, sessions=drops, deadline_s=5.0)
            made[mode] = result, {name: load_file(str(out / name)) for name in RESULTS}
        return made[mode]

    return of


def sparse_finished(cluster, mode: str, attacks: tuple[str, ...]) -> tuple[Any, dict[int, ProjectProc], str]:
    """As :func:`finished` on the sparse graph: fifteen honest clients hosted in two ``lorm-client --sessions``
    processes, each client with its own certificate and ledger, and the hostile client. ``(cluster, the honest
    process of each client index, what the hostile client said)``."""
    c = cluster(sparse_config(mode).to_json())
    server = c.server("--round-deadline", SPARSE_DEADLINE_S, "--linger", "60")
    server.wait_for("serving on")
    half = SPARSE_HOSTILE // 2
    counts = (half, SPARSE_HOSTILE - half)
    hosts = [c.hosted(0, counts[0]), c.hosted(half, counts[1])]
    for h, count in zip(hosts, counts):
        for _ in range(count):  # every hosted client has built its model before the hostile one completes the run
            h.wait_for("model: ", timeout=300)
    hostile = hostile_client(c, attacks, SPARSE_HOSTILE)
    assert server.wait(timeout=600) == 0
    assert [h.wait(timeout=60) for h in hosts] == [0, 0] and hostile.wait(timeout=30) == 0
    return c, {i: hosts[0] if i < half else hosts[1] for i in range(SPARSE_HOSTILE)}, "".join(hostile.lines)


@pytest.mark.slow  # minutes: sixteen clients training in three processes beside a coordinator
@pytest.mark.parametrize("mode", ["honest", "signed"])
def test_on_the_sparse_graph_a_low_order_key_and_a_garbage_box_leave_the_clean_result(cluster, sparse_reference, mode):
    """The attacks of the first test on a sparse graph: the garbage box goes to the hostile client's first
    neighbour (client 0 is seldom one), whose process answers without it and says so."""
    c, honest, said = sparse_finished(cluster, mode, ("--low-order", str(LOW_ORDER)))
    assert "round 0 attempt 0: low-order key refused (INVALID_ARGUMENT)" in said
    assert "round 1 attempt 0: masked input and an honest answer sent" in said
    victim = int(said.split("round 1 attempt 0: sent client ")[1].split()[0])
    assert "do not open" in "".join(honest[victim].lines)

    metrics = the_clean_result(c, sparse_reference(mode))
    low, box, gram = (h["secagg"] for h in metrics["history"][:3])
    assert low["graph"] == "sparse" and low["neighbours"] < SPARSE_N - 1
    assert low["attempt"] == 0 and low["survivors"] == SPARSE_HOSTILE and "failed" not in low
    assert box["attempt"] == 0 and box["survivors"] == SPARSE_N and "failed" not in box
    if mode == "honest":
        assert list(box["blamed"]) == [str(SPARSE_HOSTILE)] and f"client {victim}" in box["blamed"][str(SPARSE_HOSTILE)]
    else:
        assert not box.get("blamed") and str(SPARSE_HOSTILE) in json.dumps(box["complaints"]), box
    assert gram["attempt"] == 0 and gram["dropped"] == [SPARSE_HOSTILE]


@pytest.mark.slow  # minutes: sixteen clients training in three processes beside a coordinator
def test_on_the_sparse_graph_a_dealer_of_wrong_shares_is_proven_and_left_out(cluster, sparse_reference):
    """The bad deal of the second test on a sparse graph: the dealer's neighbours cannot rebuild its seed, the
    coordinator names it with its own signatures' proof, and the restart without it is the clean result."""
    c, _, said = sparse_finished(cluster, "signed", ("--bad-deal", str(LOW_ORDER)))
    assert "round 0 attempt 0: dealt shares of another seed than committed" in said
    assert "round 0 attempt 1: keys and shares sent" not in said

    metrics = the_clean_result(c, sparse_reference("signed"))
    deal, box, gram = (h["secagg"] for h in metrics["history"][:3])
    assert deal["graph"] == "sparse" and deal["attempt"] == 1 and deal["survivors"] == SPARSE_HOSTILE
    assert list(deal["excluded"]) == [str(SPARSE_HOSTILE)]
    assert box["attempt"] == 0 and box["survivors"] == SPARSE_N and "failed" not in box
    assert gram["attempt"] == 0 and gram["dropped"] == [SPARSE_HOSTILE]
