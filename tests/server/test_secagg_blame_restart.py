"""A signed secure step restarts without a dealer proven to deal wrong shares, and without anyone else.

Five signed clients through the coordinator (threshold 4). Client 1 deals shares of another seed than it committed
to, so session 0's sum cannot be unmasked: the coordinator names client 1 with the proof its own signatures make,
and restarts the step without it. A client that answered session 0 takes part in the restart only for the same
survivors less the proven: it checks each proof (``SecureRounds.check_restart``) through the coordinator's ``blame``
stage. A coordinator that also leaves out an honest client, or forges a proof against one, is refused, since the two
sums would differ by that client's input. With the proof the restart finishes: the sum of the four honest inputs."""

from __future__ import annotations

import json
import os

import pytest
import torch
from test_coordinator import SPEC, config, update_for

from client.secure import SecureRounds
from common.infra.tls import Security
from common.merges.sums import running_sums
from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.primitives import SecAggError
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import client_terms, context, fixed_point, masked_update
from common.wire.messages import Phase, RoundPlan
from proto import secagg_codec
from server.certs import create_dev_pki
from server.checks import Options
from server.coordinator import Coordinator
from server.strategies import make_strategy

N, T = 5, 4
LIAR = 1
SIGNED = SecAggSettings(enabled=True, mode="signed")


class Calls:
    """``client.transport.CoordinatorClient.secagg``'s contract on the coordinator object itself: the reply goes
    through the wire codec as over gRPC, without the network hop."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    def secagg(self, plan: RoundPlan, index: int, stage: str, keys=None, shares=None) -> dict:
        step = (plan.task, plan.round, plan.phase)
        reply = self.coord.secagg(f"c{index}", index, plan.run_id, step, stage, keys, shares, plan.secure_attempt)
        return secagg_codec.secagg_reply_from_proto(secagg_codec.secagg_reply_to_proto(reply))


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_dev_pki(tmp_path_factory.mktemp("pki"), [f"c{i}" for i in range(N)])


def session(coord: Coordinator, pki, plan: RoundPlan, members: list[int], liar: int | None = None) -> None:
    """One signed session of ``members`` through the coordinator, every round; ``liar`` deals another seed."""
    verifier = Verifier(pki.ca.read_bytes())
    signers = {i: Signer.from_files(pki.client_cert(f"c{i}"), pki.client_key(f"c{i}")) for i in members}
    parties = {i: ClientSession(i, T, context(plan), signers[i], verifier) for i in members}
    if liar is not None:
        parties[liar].seed = os.urandom(16)
    calls = Calls(coord)
    for p in parties.values():
        calls.secagg(plan, p.index, "advertise", keys=p.advertise())
    roster = calls.secagg(plan, members[0], "roster")["roster"]  # index -> keys, as the codec reads it
    for p in parties.values():
        calls.secagg(plan, p.index, "share", shares=p.share(roster))
    inbox = {i: calls.secagg(plan, i, "inbox") for i in members}
    strategy = make_strategy(coord.config, SPEC)
    fp = fixed_point(SIGNED, N)
    for p in parties.values():
        u = update_for(plan, p.index)
        terms = client_terms(strategy.aggregator(plan), u)
        masked = masked_update(u, terms, p, inbox[p.index]["sharers"], fp, plan.secure_attempt)
        coord.submit(masked, f"k{p.index}-{plan.secure_attempt}")
    request = calls.secagg(plan, members[0], "unmask")
    survivors, dropped = request["survivors"], request["dropped"]
    for p in parties.values():
        calls.secagg(plan, p.index, "confirm", shares={p.index: p.confirm(survivors, dropped)})
    confirmations = calls.secagg(plan, members[0], "confirmations")["shares"]
    for p in parties.values():
        answer = p.reveal(inbox[p.index]["shares"], survivors, dropped, confirmations)
        calls.secagg(plan, p.index, "reveal", shares=answer)


def rounds_for(coord: Coordinator, pki, plan: RoundPlan, index: int, answered: list[int]) -> SecureRounds:
    """Client ``index``'s secure rounds of the restarted ``plan``, having answered a session of ``answered``."""
    security = Security(ca=str(pki.ca), cert=str(pki.client_cert(f"c{index}")), key=str(pki.client_key(f"c{index}")))
    return SecureRounds(Calls(coord), coord.config, SPEC, index, plan, security=security, answered=answered)  # type: ignore[arg-type]


def test_a_restart_leaves_out_the_proven_dealer_and_nobody_else(tmp_path, pki):
    run = config(num_clients=N, num_tasks=1, settings={"secagg": {"enabled": True, "mode": "signed"}})
    coord = Coordinator(run, tmp_path / "state", Options())
    for i in range(N):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.phase == Phase.TRAIN
    session(coord, pki, plan, list(range(N)), liar=LIAR)
    secure = coord.step.intake.secure
    assert secure.attempt == 1 and list(secure.excluded) == [LIAR] and "prove" in secure.excluded[LIAR]
    assert list(secure.proofs) == [LIAR] and secure.proofs[LIAR]["attempt"] == 0
    restart = coord.pull("c0")
    assert isinstance(restart, RoundPlan) and restart.secure_attempt == 1
    honest = [i for i in range(N) if i != LIAR]

    rounds = rounds_for(coord, pki, restart, 0, list(range(N)))
    rounds.check_restart(honest)  # the same survivors less the proven dealer: answered
    with pytest.raises(SecAggError, match=r"only \[1\] are proven .* differ by another client's input"):
        rounds.check_restart([0, 2, 4])  # client 3 left out too: the two sums would differ by its input
    with pytest.raises(SecAggError, match="differ by another client's input"):
        rounds.check_restart(list(range(N)))  # the proven dealer back in, or a newcomer
    # A coordinator that also blames honest client 3, with client 1's proof relabelled or with 3's honest shares
    forged = dict(secure.proofs[LIAR]) | {"dealer": 3}
    secure.proofs[3] = forged
    with pytest.raises(SecAggError, match=r"refused proofs: client 3"):
        rounds.check_restart([0, 2, 4])
    later = dict(secure.proofs[LIAR]) | {"attempt": 1}  # a proof that names the restart itself
    secure.proofs[3] = later
    with pytest.raises(SecAggError, match=r"refused proofs: client 3: a proof of session 1"):
        rounds.check_restart([0, 2, 4])
    secure.proofs[3] = {"dealer": 3, "nested": json.loads("[" * 50 + "]" * 50)}
    with pytest.raises(SecAggError, match=r"refused proofs: client 3"):
        rounds.check_restart([0, 2, 4])
    del secure.proofs[3]
    old = rounds_for(coord, pki, restart, 0, [])  # a ledger written before survivors were recorded: nothing to keep
    with pytest.raises(SecAggError, match="differ by another client's input"):
        old.check_restart(honest)

    session(coord, pki, restart, honest)  # the restart, of the four honest clients: the step merges
    entry = coord.run.history[0]["secagg"]
    assert entry["survivors"] == len(honest) and entry["attempt"] == 1
    strategy = make_strategy(run, SPEC)
    plain = strategy.aggregator(plan)
    for i in honest:
        plain.fold(update_for(plan, i))
    want = running_sums(plain)["num_samples"]
    assert torch.equal(want, torch.tensor(float(sum(10 + i for i in honest)), dtype=torch.float64))
