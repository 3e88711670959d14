"""bench/secagg_cost.py at toy size: the rounds it drives are the protocol (the unmasked sums are
the survivors' plain sums, in both secure modes), its byte counts are the fields' sizes, and every mode yields
a row."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest

from common.merges.sums import running_sums
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
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
    return bench.dev_pki(CLIENTS, str(tmp_path_factory.mktemp("pki")))


def first_step(bench):
    config = RunConfig(run_id="bench", method="lorm", num_clients=CLIENTS, num_tasks=1, rounds_per_task=1, rank=2)
    strategy = make_strategy(config, SPEC)
    strategy.begin_task(0)
    phase, round_ = next(iter(strategy.steps(0)))
    plan = strategy.configure(0, round_, phase)
    shapes = strategy.aggregator(plan).expected()
    return config, strategy, plan, {i: bench.made_up_update(plan, shapes, i) for i in range(CLIENTS)}


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
    want = strategy.aggregator(plan)
    for i in (0, 1, 2):
        want.fold(updates[i])
    for name, value in running_sums(want).items():
        assert float((running_sums(got)[name] - value).abs().max()) < 1e-9, name

    sent, keys = run.sent[0], run.transcript[0][1][0]  # client 0's advertised keys, as the coordinator got them
    signature = len(pki.signers[0].certificate) + len(keys.signature) if signed else 0
    assert sent["advertise"] == 4 + 3 * KEY_BYTES + signature  # index, two public keys, seed commitment
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


def test_every_mode_yields_a_row(bench, pki):
    config, *_ = first_step(bench)
    rows = list(bench.measure(config, SPEC, CLIENTS, [0.0, 0.25], list(bench.MODES), pki, steps=["train B"]))
    assert [(r["mode"], r["dropped"]) for r in rows] == [(m, d) for d in (0, 1) for m in bench.MODES]
    for r in rows:
        assert r["coordinator_s"] > 0 and r["peak"] >= 0 and r["sent"] > 0
        assert bench.table_row(r).count("|") == bench.HEAD.count("|")
    secure = [r for r in rows if r["mode"] != "plain"]
    assert all(r["client_s"] > 0 and r["peak"] > 0 and r["received"] > 0 for r in secure)
    honest, signed = (next(r for r in secure if r["mode"] == m and r["dropped"] == 1) for m in ("honest", "signed"))
    assert signed["per_round"]["advertise"] > honest["per_round"]["advertise"] + 300  # certificate and signature
    assert signed["per_round"]["confirm"] > 0 == honest["per_round"]["confirm"]
