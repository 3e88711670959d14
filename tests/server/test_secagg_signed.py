"""Secure aggregation's signed mode: against a coordinator that deviates from the protocol.

Each client signs its advertised keys with its mTLS key and checks every roster entry against the run's
CA; before revealing a share it needs the threshold's signatures over one and the same unmask request.
The attacks here are the coordinator's: substituting a client's keys, moving them to another slot,
relaying one identity twice, and showing different unmask requests to different clients."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from test_coordinator import SPEC, config, update_for

from common.merges.sums import running_sums
from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.primitives import SecAggError
from common.secagg.rounds import default_threshold
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import client_terms, context, fixed_point, masked_update, threshold
from common.wire.messages import Phase, RoundPlan
from server.certs import create_dev_pki
from server.checks import Options
from server.coordinator import Coordinator
from server.strategies import make_strategy

N = 5
SIGNED = SecAggSettings(enabled=True, mode="signed")
CTX = b"unit|0|0|train"


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    out = tmp_path_factory.mktemp("pki")
    made = create_dev_pki(out, [f"c{i}" for i in range(N)])
    foreign = create_dev_pki(tmp_path_factory.mktemp("foreign"), ["c2"])
    return made, foreign


def signer(pki, i: int, foreign: bool = False) -> Signer:
    made = pki[1] if foreign else pki[0]
    return Signer.from_files(made.client_cert(f"c{i}"), made.client_key(f"c{i}"))


def sessions(pki, ctx: bytes = CTX) -> list[ClientSession]:
    verifier = Verifier(pki[0].ca.read_bytes())
    t = threshold(SIGNED, N)
    return [ClientSession(i, t, ctx, signer(pki, i), verifier) for i in range(N)]


def test_the_signed_mode_needs_more_than_two_thirds():
    assert threshold(SIGNED, 10) == default_threshold(10, signed=True) == 7
    with pytest.raises(SecAggError, match="more than two thirds"):
        threshold(dataclasses.replace(SIGNED, threshold=6, unsafe_low_threshold=True), 10)


def test_m5_a_substituted_key_fails_every_honest_clients_check(pki):
    """The coordinator hands client 0 a roster where client 2's mask key is its own: client 0 shares nothing."""
    parties = sessions(pki)
    roster = {p.index: p.keys for p in parties}
    assert parties[0].share(dict(roster))  # the true roster verifies
    mine = ClientSession(2, threshold(SIGNED, N), CTX)  # the coordinator's own key pair for slot 2
    swapped = dict(roster) | {2: dataclasses.replace(roster[2], mask_public=mine.keys.mask_public)}
    with pytest.raises(SecAggError, match="does not verify"):
        parties[0].share(swapped)


def test_m5_keys_moved_to_another_slot_or_one_identity_twice_are_refused(pki):
    parties = sessions(pki)
    roster = {p.index: p.keys for p in parties}
    moved = {i: k for i, k in roster.items() if i != 3} | {4: dataclasses.replace(roster[3], index=4)}  # 3's as 4's
    with pytest.raises(SecAggError, match="does not verify"):
        parties[0].share(moved)
    again = ClientSession(4, threshold(SIGNED, N), CTX, signer(pki, 3), Verifier(pki[0].ca.read_bytes()))
    twice = dict(roster) | {4: again.keys}  # client 3's identity holds slots 3 and 4
    with pytest.raises(SecAggError, match="holds two slots"):
        parties[0].share(twice)


def test_m5_keys_signed_under_another_ca_are_refused(pki):
    parties = sessions(pki)
    roster = {p.index: p.keys for p in parties}
    outsider = ClientSession(
        2, threshold(SIGNED, N), CTX, signer(pki, 2, foreign=True), Verifier(pki[1].ca.read_bytes())
    )
    with pytest.raises(SecAggError):
        parties[0].share(dict(roster) | {2: outsider.keys})


def test_m5_an_unsigned_roster_entry_is_refused_in_the_signed_mode(pki):
    parties = sessions(pki)
    roster = {p.index: p.keys for p in parties} | {1: ClientSession(1, 4, CTX).keys}
    with pytest.raises(SecAggError, match="no certificate"):
        parties[0].share(roster)


def test_m5_split_unmask_requests_reveal_nothing(pki):
    """All five share. The coordinator tells clients 0-3 that 4 dropped, and client 4 and others that 0
    dropped, hoping to collect a survivor's seed share and its mask key share. Each client signs only the
    request it was shown; no request gathers the threshold (4) of signatures, so nobody reveals."""
    parties = sessions(pki)
    roster = {p.index: p.keys for p in parties}
    boxes = {p.index: p.share(roster) for p in parties}
    for p in parties:
        p.sharers = list(range(N))
    a = ([0, 1, 2, 3], [4])
    b = ([1, 2, 3, 4], [0])
    signed_a = {i: parties[i].confirm(*a) for i in (0, 1, 2)}  # 3 of the group shown request a
    signed_b = {i: parties[i].confirm(*b) for i in (3, 4)}
    inbox = {j: boxes[j][1] for j in range(N) if j != 1}
    with pytest.raises(SecAggError, match="fewer than the threshold 4"):
        parties[1].reveal(inbox, *a, confirmations=signed_a)
    with pytest.raises(SecAggError, match="did not sign"):  # client 1 signed a: b is refused outright
        parties[1].reveal(inbox, *b, confirmations=signed_b | {1: signed_a[1]})
    with pytest.raises(SecAggError, match="another unmask request"):
        parties[3].confirm(*a)  # once signed, a client signs no other request of the step
    forged = signed_a | {3: signed_b[3]}  # client 3's signature over b, passed off as one over a
    with pytest.raises(SecAggError, match="does not verify"):
        parties[0].reveal({j: boxes[j][0] for j in range(N) if j != 0}, *a, confirmations=forged)


def test_a_signed_step_over_the_coordinator_merges_the_clients_sum(tmp_path, pki):
    """Five signed clients through the coordinator (threshold 4): keys, shares, masked inputs, the signed
    consistency round, the unmask answers; the step merges the plain sum."""
    run = config(num_clients=N, num_tasks=1, settings={"secagg": {"enabled": True, "mode": "signed"}})
    coord = Coordinator(run, tmp_path / "state", Options())
    for i in range(N):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.phase == Phase.TRAIN
    ref = (plan.task, plan.round, plan.phase)
    parties = sessions(pki, context(plan))
    strategy = make_strategy(run, SPEC)

    def call(i: int, stage: str, **kw) -> dict:
        return coord.secagg(f"c{i}", i, plan.run_id, ref, stage, **kw)

    for p in parties:
        call(p.index, "advertise", keys=p.advertise())
    roster = call(0, "roster")["roster"]
    for p in parties:
        call(p.index, "share", shares=p.share({k.index: k for k in roster}))
    inbox = {p.index: call(p.index, "inbox") for p in parties}
    fp = fixed_point(SIGNED, N)
    for p in parties:
        u = update_for(plan, p.index)
        terms = client_terms(strategy.aggregator(plan), u)
        assert coord.submit(masked_update(u, terms, p, inbox[p.index]["sharers"], fp), f"k{p.index}")
    request = call(0, "unmask")
    survivors, dropped = request["survivors"], request["dropped"]
    assert not call(0, "confirmations")["ready"]
    for p in parties:
        call(p.index, "confirm", shares={p.index: p.confirm(survivors, dropped)})
    confirmations = call(0, "confirmations")["shares"]
    assert sorted(confirmations) == list(range(N))
    for p in parties:
        call(p.index, "reveal", shares=p.reveal(inbox[p.index]["shares"], survivors, dropped, confirmations))
    entry = coord.run.history[0]["secagg"]
    assert entry["survivors"] == N and entry["threshold"] == 4 and entry["bytes_received"]["confirm"] > 0
    plain = strategy.aggregator(plan)
    for i in range(N):
        plain.fold(update_for(plan, i))
    want = running_sums(plain)["num_samples"]
    assert torch.equal(want, torch.tensor(float(sum(10 + i for i in range(N))), dtype=torch.float64))
