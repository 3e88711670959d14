"""Verifiable blame in secure aggregation's signed mode: a dealer's own signatures prove what it dealt.

Each dealer signs every box's header and its recipient's x-coordinate; an answer carries, beside each share of another
client's secret, that header and signature. So an answerer cannot reveal a share it was not dealt (refused on
arrival, the spare answers finish the sum), a dealer whose shares rebuild to another secret than it committed to is
proven to have done so by ``t`` shares under its own signature, and no coordinator can build such a proof against an
honest dealer: each attack on the proof below is refused by the check the clients run."""

from __future__ import annotations

import dataclasses
import functools
import os

import numpy as np
import pytest

from common.secagg.blame import check_blame, split_signed
from common.secagg.client_session import ClientSession
from common.secagg.primitives import FixedPoint, SecAggError, encode, ring_add
from common.secagg.rounds import BOX_BYTES, Culprits
from common.secagg.server_session import ServerSession
from common.secagg.signing import Signer, Verifier
from server.certs import create_dev_pki

N, T = 5, 4  # the signed mode's threshold of five: floor(2n / 3) + 1
CTX = b"blame|0|0|train|0"
FP = FixedPoint(frac_bits=16)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_dev_pki(tmp_path_factory.mktemp("pki"), [f"c{i}" for i in range(N)])


@pytest.fixture(scope="module")
def verifier(pki) -> Verifier:
    return Verifier(pki.ca.read_bytes())


def parties(pki, verifier: Verifier, ctx: bytes = CTX) -> list[ClientSession]:
    signers = [Signer.from_files(pki.client_cert(f"c{i}"), pki.client_key(f"c{i}")) for i in range(N)]
    return [ClientSession(i, T, ctx, signers[i], verifier) for i in range(N)]


def inputs() -> dict[int, np.ndarray]:
    rng = np.random.default_rng(0)
    return {i: rng.normal(size=6) for i in range(N)}


def keyed(pki, verifier, dealer_lies: int | None = None) -> tuple[list[ClientSession], ServerSession, dict]:
    """A signed session of five whose keys round is closed: ``(clients, coordinator, roster)``; client
    ``dealer_lies`` will deal shares of another seed than the one it committed to (and mask with that other seed,
    so only its shares' secret is wrong)."""
    clients = parties(pki, verifier)
    if dealer_lies is not None:
        clients[dealer_lies].seed = os.urandom(16)  # committed at advertise to the first seed, dealt the second
    server = ServerSession(list(range(N)), T, CTX, signed=True, check=verifier.verify)
    for c in clients:
        server.advertise(c.advertise())
    return clients, server, server.close_keys()


def confirmed(clients: list[ClientSession], server: ServerSession, boxes: dict) -> tuple[list, list, dict]:
    """The share, input and consistency rounds after the keys: ``(survivors, dropped, confirmations)``."""
    for c in clients:
        server.share(c.index, boxes[c.index])
    sharers = server.close_shares()
    values = inputs()
    for c in clients:
        server.masked_input(c.index, c.mask(encode(values[c.index], FP), sharers))
    survivors, dropped = server.close_inputs()
    confirmations = {c.index: c.confirm(survivors, dropped) for c in clients}
    for c in clients:
        server.confirm(c.index, confirmations[c.index])
    return survivors, dropped, confirmations


def run_until_answers(pki, verifier, dealer_lies: int | None = None) -> tuple[list[ClientSession], ServerSession, dict]:
    """A signed session of five up to every client's unmask answer (:func:`keyed`, :func:`confirmed`)."""
    clients, server, roster = keyed(pki, verifier, dealer_lies)
    survivors, dropped, confirmations = confirmed(clients, server, {c.index: c.share(roster) for c in clients})
    answers = {c.index: c.reveal(server.inbox(c.index), survivors, dropped, confirmations) for c in clients}
    return clients, server, answers


def test_a_dealer_whose_shares_rebuild_another_seed_is_proven_by_its_own_signatures(pki, verifier):
    _, server, answers = run_until_answers(pki, verifier, dealer_lies=1)
    for a, answer in answers.items():
        server.reveal(a, answer)
    with pytest.raises(Culprits) as caught:
        server.result()
    assert list(caught.value.why) == [1] and "its own signatures prove it" in caught.value.why[1]
    proof = caught.value.proofs[1]
    assert check_blame(proof, verifier, CTX, T) == 1
    assert sorted(map(int, proof["entries"])) == [0, 2, 3, 4]  # the first t answers but the dealer's own


def test_no_proof_can_be_made_against_an_honest_dealer(pki, verifier):
    """The attacks a coordinator has on the check, each from a true proof against client 1: another client's
    advertise passed off as the dealer's; an honest dealer's own shares; a share changed, a position moved, a share of
    the dealer's other secret, too few or the dealer's own share, another session's context."""
    _, server, answers = run_until_answers(pki, verifier, dealer_lies=1)
    for a, answer in answers.items():
        server.reveal(a, answer)
    with pytest.raises(Culprits) as caught:
        server.result()
    true = caught.value.proofs[1]
    honest_keys = [f.hex() for f in dataclasses.astuple(server.roster[2])[1:]]
    with pytest.raises(SecAggError, match="the roster's entry for client 1"):  # client 2's advertise as client 1's
        check_blame(true | {"keys": honest_keys}, verifier, CTX, T)
    as_of_two = true | {"dealer": 2, "keys": honest_keys}
    twos = {str(a): answers[a][2].hex() for a in (0, 1, 3, 4)}  # client 2's own shares, under its signature
    honest = as_of_two | {"entries": twos}
    with pytest.raises(SecAggError, match="rebuild the secret it committed to"):
        check_blame(honest, verifier, CTX, T)

    def entry_changed(change) -> dict:
        a = next(iter(true["entries"]))
        raw = bytearray(bytes.fromhex(true["entries"][a]))
        change(raw)
        return true | {"entries": true["entries"] | {a: bytes(raw).hex()}}

    def flip_share(raw: bytearray) -> None:
        raw[0] ^= 1

    def move_position(raw: bytearray) -> None:
        raw[16 + 96 + 3] ^= 7

    with pytest.raises(SecAggError, match="unlike the one dealt"):
        check_blame(entry_changed(flip_share), verifier, CTX, T)
    with pytest.raises(SecAggError, match="not signed by it"):
        check_blame(entry_changed(move_position), verifier, CTX, T)
    with pytest.raises(SecAggError, match="not signed by it"):  # a seed proof read as one of the mask key
        check_blame(true | {"secret": "key"}, verifier, CTX, T)
    fewer = true | {"entries": dict(list(true["entries"].items())[: T - 1])}
    with pytest.raises(SecAggError, match="needs 4 other clients"):
        check_blame(fewer, verifier, CTX, T)
    with pytest.raises(SecAggError, match="needs 4 other clients"):
        check_blame(true | {"entries": true["entries"] | {"1": answers[1][1].hex()}}, verifier, CTX, T)
    with pytest.raises(SecAggError, match="another session"):
        check_blame(true, verifier, CTX + b"1", T)
    with pytest.raises(SecAggError, match="does not parse"):
        check_blame({"dealer": "x"}, verifier, CTX, T)


def test_an_answer_holding_a_share_not_dealt_is_refused_on_arrival_and_the_spares_finish_the_sum(pki, verifier):
    """Client 3 reveals a changed share of client 0's seed: in the honest mode it is named only once every answer is
    in and the session restarts; here its answer is refused when it arrives (an honest answerer reveals only a
    share it opened under its dealer's signature), and the other four, the threshold, unmask the exact sum."""
    _, server, answers = run_until_answers(pki, verifier)
    lie = bytearray(answers[3][0])
    lie[0] ^= 1
    with pytest.raises(SecAggError, match="client 3 revealed a share of client 0's own-mask seed unlike"):
        server.reveal(3, answers[3] | {0: bytes(lie)})
    other = server.boxes[0][4]  # the header, x-coordinate and signature of client 0's box for client 4
    borrowed = answers[3][0][:16] + other[:96] + other[BOX_BYTES:]
    with pytest.raises(SecAggError, match="client 0's box for client 3 is not signed by it"):
        server.reveal(3, answers[3] | {0: borrowed})
    unsigned = answers[3] | {0: answers[3][0][:16]}  # the share alone, as the honest mode sends it
    with pytest.raises(SecAggError, match="does not hold one share"):
        server.reveal(3, unsigned)
    for a in (0, 1, 2, 4):
        server.reveal(a, answers[a])
    assert server.ready(late=True) and not server.ready()
    want = functools.reduce(ring_add, (encode(v, FP) for v in inputs().values()))
    assert np.array_equal(server.result(), want)  # the ring sum of all five encoded inputs, exactly


def test_a_box_without_its_dealers_signature_is_a_complaint_and_a_moved_or_unsigned_box_is_refused(pki, verifier):
    """The coordinator checks each box's form and x-coordinate, not its signature (n^2 of them): a recipient whose
    box from client 1 does not carry client 1's signature answers without that share and complains; the other
    answers rebuild client 1's seed, and the sum is exact."""
    clients, server, roster = keyed(pki, verifier)
    boxes = {c.index: c.share(roster) for c in clients}
    box, header, position, sig = split_signed(boxes[1][0], BOX_BYTES)
    assert position == 1 and header == box[:96]
    moved = dict(boxes[1]) | {0: boxes[1][2]}  # client 2's box (signed for client 2) relayed to client 0
    with pytest.raises(SecAggError, match="names x-coordinate 3, not its place 1"):
        server.share(1, moved)
    plain = {j: b[:BOX_BYTES] for j, b in boxes[1].items()}  # the honest mode's boxes, without signatures
    with pytest.raises(SecAggError, match="signed entry of 160 bytes"):
        server.share(1, plain)
    forged = dict(boxes[1]) | {0: boxes[1][0][:-1] + bytes([sig[-1] ^ 1])}
    survivors, dropped, confirmations = confirmed(clients, server, {**boxes, 1: forged})
    for c in clients:
        answer = c.reveal(server.inbox(c.index), survivors, dropped, confirmations)
        assert (c.complaints == [1]) == (c.index == 0)
        if c.index == 0:
            assert answer[1] == b"!"  # a complaint, no key (the signed mode)
        elif c.index != 1:
            assert len(answer[1]) > 16  # the share with its header and signature
        server.reveal(c.index, answer)
    want = functools.reduce(ring_add, (encode(v, FP) for v in inputs().values()))
    assert np.array_equal(server.result(), want)
