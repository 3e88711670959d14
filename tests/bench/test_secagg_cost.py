"""bench/secagg_cost.py at toy size: the rounds it drives are the protocol (the unmasked sums are
the survivors' plain sums, in both secure modes, on the complete and the sparse graph), its byte counts are the
fields' sizes, every mode and graph yields a row, and the cost model fits them."""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path
from types import ModuleType

import pytest

from common.merges.sums import running_sums
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
from common.secagg.graph import derive
from common.secagg.rounds import BOX_BYTES, KEY_BYTES
from common.wire.messages import ModelSpec
from server.strategies import make_strategy

SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=3,
    num_classes=6,
    params={"emb.weight": (5, 4), "l1.base.weight": (3, 4), "l1.base.bias": (3,), "l2.base.weight": (2, 3)},
)
CLIENTS = 4
GONE = (3,)  # drops after sharing; the threshold is 3 in both modes
SPARSE = 40  # clients of the sparse rows: derive(40, 0.1, 0.0) is k = 12 of 39, t = 8
SPARSE_GONE = tuple(range(SPARSE - 4, SPARSE))  # the last ones: random places on the ring


@pytest.fixture(scope="module")
def bench() -> ModuleType:
    path = Path(__file__).resolve().parents[2] / "bench" / "secagg_cost.py"
    spec = importlib.util.spec_from_file_location("secagg_cost", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pki(bench, tmp_path_factory):
    return bench.dev_pki(SPARSE, str(tmp_path_factory.mktemp("pki")))


def first_step(bench, clients: int = CLIENTS):
    config = RunConfig(run_id="bench", method="lorm", num_clients=clients, num_tasks=1, rounds_per_task=1, rank=2)
    strategy = make_strategy(config, SPEC)
    strategy.begin_task(0)
    phase, round_ = next(iter(strategy.steps(0)))
    plan = strategy.configure(0, round_, phase)
    shapes = strategy.aggregator(plan).expected()
    return config, strategy, plan, {i: bench.made_up_update(plan, shapes, i) for i in range(clients)}


def assert_plain_sum(strategy, plan, got, updates, gone) -> None:
    want = strategy.aggregator(plan)
    for i, u in updates.items():
        if i not in gone:
            want.fold(u)
    for name, value in running_sums(want).items():
        assert float((running_sums(got)[name] - value).abs().max()) < 1e-9, name


@pytest.mark.parametrize("mode", ["honest", "signed"])
def test_the_driven_rounds_unmask_the_survivors_sum_and_count_every_field(bench, pki, mode):
    _, strategy, plan, updates = first_step(bench)
    signed = mode == "signed"
    got = strategy.aggregator(plan)
    run = bench.secure_run(
        got,
        strategy,
        updates,
        SecAggSettings(enabled=True, mode=mode),
        GONE,
        pki.signers if signed else None,
        pki.verifier if signed else None,
    )
    assert run.graph.complete and run.graph.k == CLIENTS - 1
    assert_plain_sum(strategy, plan, got, updates, GONE)

    sent, keys = run.sent[0], run.transcript[0][1][0]  # client 0's advertised keys, as the coordinator got them
    signature = len(pki.signers[0].certificate) + len(keys.signature) if signed else 0
    assert sent["advertise"] == 4 + 3 * KEY_BYTES + signature  # index, two public keys, seed commitment
    advertised = {message[0].index: message[0] for call, message in run.transcript if call == "advertise"}
    assert run.received["roster"] == sum(map(bench.keys_bytes, advertised.values()))  # everyone's keys, its own too
    boxes = next(message[1] for call, message in run.transcript if call == "share" and message[0] == 0)
    suffix = {j: len(b) - BOX_BYTES for j, b in boxes.items()}  # signed: x-coordinate and the dealer's signature
    assert all(4 < n <= 4 + 72 for n in suffix.values()) if signed else set(suffix.values()) == {0}
    assert sent["share"] == (CLIENTS - 1) * BOX_BYTES + sum(suffix.values())
    assert sent["masked"] == 16 * run.layout.size and run.sent[3]["masked"] == 0
    confirmations = [len(message[1]) for call, message in run.transcript if call == "confirm" and message[0] == 0]
    assert sent["confirm"] == sum(confirmations) and len(confirmations) == signed
    answer = next(message[1] for call, message in run.transcript if call == "reveal" and message[0] == 0)
    entries = {j: len(e) - (16 if j != 3 else 32) for j, e in answer.items()}  # beyond the share: signed, its box's
    assert entries[0] == 0 and all(96 + 4 < n <= 96 + 4 + 72 if signed else n == 0 for n in entries.values() if n)
    # seed shares of 3 survivors, key share of 1 dropped (signed: each but its own with its box's header and signature)
    assert sent["unmask"] == 3 * (4 + 16) + 1 * (4 + 32) + sum(entries.values())
    assert (sum(entries.values()) > 0) == signed
    # the coordinator's side runs again alone from its transcript (the sum checks again), its memory traced
    assert bench.traced_peak(lambda: bench.replay(strategy, plan, run)) > 16 * run.layout.size
    # its disk: a record per call of four rounds, its state at four points; each state holds the roster's keys
    records = sum(1 for call, _ in run.transcript if call in bench.RECORDED)
    assert records == CLIENTS + CLIENTS + signed * 3 + 3
    assert bench.disk_bytes(run) > records + 4 * CLIENTS * 2 * (3 * KEY_BYTES)


@pytest.mark.parametrize("mode", ["honest", "signed"])
def test_a_sparse_graph_unmasks_the_survivors_sum_with_neighbours_only(bench, pki, mode):
    params = derive(SPARSE, 0.1, 0.0)
    assert params.k == 12 < SPARSE - 1
    _, strategy, plan, updates = first_step(bench, SPARSE)
    signed = mode == "signed"
    got = strategy.aggregator(plan)
    settings = bench.Sizing(0.1, 0.0).settings(mode, "sparse")
    run = bench.secure_run(
        got, strategy, updates, settings, SPARSE_GONE, pki.signers if signed else None, pki.verifier if signed else None
    )
    assert not run.graph.complete and (run.graph.k, run.graph.threshold) == (params.k, params.t)
    assert run.session["graph"] is run.graph  # the replay's session too
    assert_plain_sum(strategy, plan, got, updates, SPARSE_GONE)

    for call, message in run.transcript:
        if call == "share":  # boxes for its k neighbours, not n - 1
            assert sorted(message[1]) == run.graph.neighbours(message[0])
        if call == "reveal":  # an answer per client of its closed neighbourhood
            assert sorted(message[1]) == run.graph.closed(message[0])
    box = BOX_BYTES if not signed else BOX_BYTES + 4
    assert all(c["share"] >= params.k * box for c in run.sent.values())
    # each client receives its neighbourhood's roster (its own keys too) and its neighbours' boxes
    keys = {message[0].index: bench.keys_bytes(message[0]) for call, message in run.transcript if call == "advertise"}
    rosters = [sum(keys[j] for j in run.graph.closed(i)) for i in range(SPARSE)]
    assert run.received["roster"] == pytest.approx(sum(rosters) / SPARSE)
    survivors = [i for i in range(SPARSE) if i not in SPARSE_GONE]
    inbox = sum(len(run.graph.neighbours(i)) for i in survivors) / len(survivors)
    assert run.received["inbox"] >= inbox * box
    if signed:  # its closed neighbourhood's confirmations only
        near = [sum(j not in SPARSE_GONE for j in run.graph.closed(i)) for i in survivors]
        assert run.received["confirmations"] <= sum(near) / len(near) * (4 + 72)
        assert run.received["confirmations"] > 0
    assert bench.traced_peak(lambda: bench.replay(strategy, plan, run)) > 16 * run.layout.size
    assert bench.disk_bytes(run) > 0


def test_every_mode_and_graph_yields_a_row_and_the_cost_model_fits(bench, pki, tmp_path, capsys):
    config, *_ = first_step(bench)
    rows = list(bench.measure(config, SPEC, CLIENTS, [0.0, 0.25], list(bench.MODES), pki, steps=["train B"]))
    secure_runs = [(m, g) for g in bench.GRAPHS for m in ("honest", "signed")]
    assert [(r["mode"], r["graph"], r["dropped"]) for r in rows] == [
        x for d in (0, 1) for x in [("plain", "—", d)] + [(m, g, d) for m, g in secure_runs]
    ]
    for r in rows:
        assert r["coordinator_s"] > 0 and r["peak"] >= 0 and r["sent"] > 0
        assert bench.table_row(r).count("|") == bench.HEAD.count("|")
    secure = [r for r in rows if r["mode"] != "plain"]
    assert all(r["client_s"] > 0 and r["peak"] > 0 and r["received"] > 0 and r["disk"] > 0 for r in secure)
    for r in secure:  # the coordinator's time by part: its calls, the secrets' rebuild, the masks' removal, the merge
        parts = r["coordinator_parts"]
        assert {"share", "reveal", "rebuild", "unmask", "load", "merge"} <= set(parts)
        assert sum(parts.values()) == pytest.approx(r["coordinator_s"], rel=0.2, abs=5e-3)
    assert all(r["k"] == CLIENTS - 1 for r in secure)  # 4 clients: too few for a sparse graph
    honest, signed = (
        next(r for r in secure if r["mode"] == m and r["dropped"] == 1 and r["graph"] == "complete")
        for m in ("honest", "signed")
    )
    assert signed["per_round"]["advertise"] > honest["per_round"]["advertise"] + 300  # certificate and signature
    assert signed["per_round"]["confirm"] > 0 == honest["per_round"]["confirm"]
    assert signed["disk"] > honest["disk"]  # certificates, signatures, signed boxes and answers

    sparse = list(
        bench.measure(
            config, SPEC, SPARSE, [0.1], ["honest"], None, ["train B"], False, ["sparse"], bench.Sizing(0.1, 0.0)
        )
    )
    assert [(r["graph"], r["k"], r["t"], r["dropped"]) for r in sparse] == [("sparse", 12, 8, 4)]
    assert "| sparse | 12 | 8 | honest | 40 | 4 |" in bench.table_row(sparse[0])
    lines = bench.cost_model(rows + sparse, [0.0, 0.1], bench.Sizing(0.1, 0.0))
    assert len([line for line in lines if line.startswith("| complete")]) == 2 * 3  # two modes, three figures
    for line in lines[4:]:
        assert line.count("|") == lines[2].count("|") and "too few rows" not in line
    # the complete graph's two rows of one K: a constant; the sparse graph's three (K = 4 and 40): simpler forms
    table = "\n".join(lines)
    assert "| complete | honest | client s | 2 | c0 | c0 = " in table
    assert "| sparse | honest | client s | 3 | c0 + c1 m | c0 = " in table
    assert "| sparse | honest | coordinator s | 3 | c0 + c1 K m | c0 = " in table
    # rows saved by several runs, fitted together
    saved = tmp_path / "rows.jsonl"
    saved.write_text("".join(json.dumps(r) + "\n" for r in rows + sparse))
    assert (
        bench.main(["--fit", str(saved), "--dropped", "0", "0.1", "--dropout-target", "0.1", "--corrupt-target", "0"])
        == 0
    )
    printed = capsys.readouterr().out
    assert bench.table_row(sparse[0]) in printed and "\n".join(lines) in printed


def test_a_fit_recovers_a_linear_law(bench):
    rows = [
        {"clients": n, "k": n - 1, "dropped": d, "y": 1 + 2e-3 * n + 3e-6 * n * (n - 1) + 4e-4 * d * (n - 1)}
        for n in (10, 50, 100)
        for d in (0, n // 10)
    ]
    model = bench.fit(rows, "y", bench.COORDINATOR)
    assert model.terms == ("1", "K", "K m", "d m")
    assert model.coefficients == pytest.approx((1, 2e-3, 3e-6, 4e-4), rel=1e-6)
    assert model(10_000, 9_999, 1_000) == pytest.approx(1 + 20 + 3e-6 * 1e4 * 9999 + 0.4 * 9999, rel=1e-6)
