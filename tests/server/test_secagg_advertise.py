"""Secure aggregation's advertise round against a hostile client, through ``Coordinator`` directly: each test
is the attack first, then what must hold. H4: keys no honest client makes (a low-order point, a signature that
does not verify) reach no honest client; H6: a client's keys replayed into a later step are refused, and the
client's own advertise is taken."""

from __future__ import annotations

import dataclasses

import pytest
from test_coordinator import SPEC, config
from test_secagg_hostile import N, Party, keys_and_shares, secure_run, session

from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import context, threshold
from common.wire.messages import RoundPlan
from server.certs import create_dev_pki
from server.checks import Options, Refused
from server.coordinator import Coordinator
from server.secure.intake import SecureIntake

SIGNED = SecAggSettings(enabled=True, mode="signed")


def finish(coord: Coordinator, parties: list[Party]) -> None:
    """The rest of the open session among ``parties``, whose keys and shares are in: inputs, answers."""
    sharers = parties[0].call("inbox")["sharers"]
    plan = parties[0].plan
    for p in parties:
        assert coord.submit(p.masked(sharers), f"k{p.i}-{plan.secure_attempt}")
    request = parties[0].call("unmask")
    for p in parties:
        inbox = p.call("inbox")["shares"]
        p.call("reveal", shares=p.session.reveal(inbox, request["survivors"], request["dropped"]))


def test_h4_a_low_order_key_is_refused_at_advertise_naming_the_client_and_the_step_goes_on(tmp_path):
    """Client 3 advertises the all-zero point as its mask key: refused, ``INVALID_ARGUMENT``, naming client 3 and
    why. Its slot stays open: client 3's own keys are then taken and the step merges all five clients' sum."""
    coord, plan = secure_run(tmp_path)
    parties = [Party(coord, i, plan) for i in range(N)]
    bad = dataclasses.replace(parties[3].session.advertise(), mask_public=bytes(32))
    with pytest.raises(Refused) as refused:
        parties[3].call("advertise", keys=bad)
    assert refused.value.code == "INVALID_ARGUMENT"
    assert "client 3" in str(refused.value) and "low-order" in str(refused.value)
    assert keys_and_shares(parties) == list(range(N))
    finish(coord, parties)
    entry = coord.run.history[0]
    assert entry["secagg"]["survivors"] == N and entry["secagg"]["attempt"] == 0


def test_h6_a_replayed_advertise_of_an_earlier_step_is_refused_and_the_clients_own_is_taken(tmp_path):
    """Step 0 runs. Client 0's step-0 advertise is sent again with step 1's reference before client 0 advertises
    in step 1: refused (a key of an earlier session), also by a coordinator restarted on the same state. Client
    0's fresh advertise is then taken and step 1 merges all five clients' sum: no slot waits for ever."""
    coord, plan = secure_run(tmp_path, rounds=2)
    parties = [Party(coord, i, plan) for i in range(N)]
    keys_and_shares(parties)
    finish(coord, parties)
    old = parties[0].session.keys
    nxt = coord.pull("c0")
    assert isinstance(nxt, RoundPlan) and nxt.round == plan.round + 1
    replayer = Party(coord, 0, nxt)
    with pytest.raises(Refused, match="earlier secure session") as refused:
        replayer.call("advertise", keys=old)
    assert refused.value.code == "INVALID_ARGUMENT"
    restarted = Coordinator(coord.config, tmp_path / "state", Options())
    with pytest.raises(Refused, match="earlier secure session"):
        Party(restarted, 0, nxt).call("advertise", keys=old)
    fresh = [Party(restarted, i, nxt) for i in range(N)]
    assert keys_and_shares(fresh) == list(range(N))
    finish(restarted, fresh)
    assert [e["secagg"]["survivors"] for e in restarted.run.history] == [N, N]


def test_h6_keys_of_an_abandoned_session_of_the_same_step_are_refused(tmp_path):
    """A session restarts (a wrong share named client 0); client 1's keys of the abandoned session, advertised
    again in the fresh one, are refused; its fresh keys are taken."""
    coord, plan = secure_run(tmp_path)
    first = [Party(coord, i, plan) for i in range(N)]
    keys_and_shares(first)
    session_keys = first[1].session.keys
    sharers = first[0].call("inbox")["sharers"]
    for p in first:
        assert coord.submit(p.masked(sharers), f"k{p.i}")
    request = first[0].call("unmask")
    for p in first:
        answer = p.session.reveal(p.call("inbox")["shares"], request["survivors"], request["dropped"])
        if p.i == 0:
            answer = {j: bytes(b ^ 0x5A for b in s) for j, s in answer.items()}
        p.call("reveal", shares=answer)
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake) and step.intake.secure.attempt == 1
    again = coord.pull("c1")
    assert isinstance(again, RoundPlan) and again.secure_attempt == 1
    with pytest.raises(Refused, match="earlier secure session"):
        Party(coord, 1, again).call("advertise", keys=session_keys)
    session(coord, [1, 2, 3, 4])
    assert coord.run.history[0]["secagg"]["attempt"] == 1


# ------------------------------------------------------------------ the signed mode


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_dev_pki(tmp_path_factory.mktemp("pki"), [f"c{i}" for i in range(N)])


def signed_run(tmp_path) -> tuple[Coordinator, RoundPlan]:
    run = config(
        num_clients=N, num_tasks=1, rounds_per_task=2, settings={"secagg": {"enabled": True, "mode": "signed"}}
    )
    coord = Coordinator(run, tmp_path / "state", Options())
    for i in range(N):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan)
    return coord, plan


def signed_session(pki, i: int, plan: RoundPlan, who: int | None = None) -> ClientSession:
    name = f"c{i if who is None else who}"
    signer = Signer.from_files(pki.client_cert(name), pki.client_key(name))
    return ClientSession(i, threshold(SIGNED, N), context(plan), signer, Verifier(pki.ca.read_bytes()))


def advertise(coord: Coordinator, plan: RoundPlan, i: int, keys) -> None:
    coord.secagg(f"c{i}", i, plan.run_id, (plan.task, plan.round, plan.phase), "advertise", keys=keys)


def test_h4_a_signed_advertise_whose_signature_does_not_verify_is_refused_at_advertise(tmp_path, pki):
    """Signed mode. Client 2 advertises keys whose signature does not verify (a flipped byte), keys signed for
    another step (a replay: the signature covers the step's context), and keys signed with client 3's certificate:
    each refused at advertise, ``INVALID_ARGUMENT``, naming client 2, so that no honest client is handed an entry
    that makes it refuse the session. Client 2's own signed keys are then taken."""
    coord, plan = signed_run(tmp_path)
    own = signed_session(pki, 2, plan)
    flipped = bytearray(own.keys.signature)
    flipped[-1] ^= 1
    other_step = signed_session(pki, 2, dataclasses.replace(plan, round=plan.round + 1))
    borrowed = signed_session(pki, 2, plan, who=3)
    for bad in (dataclasses.replace(own.keys, signature=bytes(flipped)), other_step.keys, borrowed.keys):
        with pytest.raises(Refused) as refused:
            advertise(coord, plan, 2, bad)
        assert refused.value.code == "INVALID_ARGUMENT" and "client 2" in str(refused.value)
    advertise(coord, plan, 2, own.keys)
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake) and step.intake.secure.session.keys[2] == own.keys


def test_a_certificate_of_another_ca_is_refused_at_advertise_when_the_coordinator_has_the_runs_ca(tmp_path, pki):
    """Signed mode, the coordinator given the run's CA (lorm-server's --tls-ca, Options.secagg_ca): a client that
    signs its keys with a certificate of its own CA, in its own name, is refused at advertise, so that no honest
    client is handed a roster it would refuse (and the step does not wait for its deadline)."""
    run = config(
        num_clients=N, num_tasks=1, rounds_per_task=2, settings={"secagg": {"enabled": True, "mode": "signed"}}
    )
    coord = Coordinator(run, tmp_path / "state", Options(secagg_ca=str(pki.ca)))
    for i in range(N):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan)
    rogue = create_dev_pki(tmp_path / "rogue", ["c2"])
    signer = Signer.from_files(rogue.client_cert("c2"), rogue.client_key("c2"))
    forged = ClientSession(2, threshold(SIGNED, N), context(plan), signer, Verifier(rogue.ca.read_bytes()))
    with pytest.raises(Refused) as refused:
        advertise(coord, plan, 2, forged.keys)
    assert refused.value.code == "INVALID_ARGUMENT" and "client 2" in str(refused.value)
    advertise(coord, plan, 2, signed_session(pki, 2, plan).keys)  # its certificate of the run's CA is taken
