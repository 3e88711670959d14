"""Secure aggregation against a hostile client, at the level of one step's sessions: each test is the attack
first, then what must hold. A hostile client can be left out, never crash an honest one, end the step or get an
honest client blamed.

H4: a low-order or non-canonical key, a box that does not open, a bad signature (each once crashed every honest
client). M1: a dealer that deals an honest recipient a wrong share (once got the recipient blamed)."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from common.secagg import rounds
from common.secagg.boxes import box_key, is_complaint, open_box, seal
from common.secagg.client_session import ClientSession
from common.secagg.primitives import SecAggError, keypair, ring_add
from common.secagg.rounds import BOX_BYTES, Keys
from common.secagg.server_session import ServerSession

CTX = b"run|0|0|train"
N, T = 5, 3
P = 2**255 - 19
# u-coordinates of the points of order 1, 2, 4 and 8 of Curve25519 and its twist, and non-canonical copies
LOW_ORDER = [
    0,
    1,
    325606250916557431795983626356110631294008115727848805560023387167927233504,
    39382357235489614581723060781553021112529911719440698176882885853963445705823,
    P - 1,
    P,
    P + 1,
    2**255 - 1,
]


def point(u: int) -> bytes:
    return u.to_bytes(32, "little")


def rounds_until_inputs(n: int = N, t: int = T, boxes=None):
    """``n`` honest sessions through the share round and their masked inputs (of ``xs``); ``boxes(i, sealed,
    roster)`` may replace what client ``i`` sends in the share round."""
    clients = {i: ClientSession(i, t, CTX) for i in range(n)}
    server = ServerSession(expected=list(range(n)), threshold=t, context=CTX, size=3)
    for c in clients.values():
        server.advertise(c.advertise())
    roster = server.close_keys()
    for i, c in clients.items():
        sealed = c.share(roster)
        server.share(i, boxes(i, sealed, roster) if boxes else sealed)
    sharers = server.close_shares()
    xs = {i: np.array([[i + 1, 0], [7 * i, 1], [2**63, i]], dtype=np.uint64) for i in range(n)}
    for i, c in clients.items():
        server.masked_input(i, c.mask(xs[i], sharers))
    return clients, server, xs


def exact(xs: dict[int, np.ndarray]) -> np.ndarray:
    total = np.zeros((3, 2), dtype=np.uint64)
    for x in xs.values():
        total = ring_add(total, x)
    return total


def answer_all(clients, server, edit=None):
    survivors, dropped = server.close_inputs()
    for i in survivors:
        answer = clients[i].reveal(server.inbox(i), survivors, dropped)
        server.reveal(i, edit(i, answer) if edit else answer)


# ------------------------------------------------------------------ H4: keys no honest client makes


@pytest.mark.parametrize("u", LOW_ORDER, ids=lambda u: f"u={u % 10**6}")
@pytest.mark.parametrize("which", ["cipher_public", "mask_public"])
def test_h4_a_low_order_or_non_canonical_key_is_refused_at_advertise_and_the_slot_stays_open(u, which):
    """Client 2 advertises a low-order point (or another encoding of one): the coordinator's session refuses it,
    naming the client; the slot stays open and client 2's own keys are then taken."""
    server = ServerSession(expected=list(range(N)), threshold=T, context=CTX)
    two = ClientSession(2, T, CTX)
    with pytest.raises(SecAggError, match="client 2's .*(low-order|canonical)"):
        server.advertise(dataclasses.replace(two.keys, **{which: point(u)}))
    assert 2 not in server.keys
    server.advertise(two.keys)
    assert server.keys[2] == two.keys


def test_h4_a_high_bit_copy_of_another_clients_key_is_refused():
    """Client 1 advertises client 0's key with the high bit set: the same point to X25519, other bytes. Refused
    (not canonical), as is a copy in canonical form (the same fingerprint)."""
    server = ServerSession(expected=list(range(N)), threshold=T, context=CTX)
    zero, one = ClientSession(0, T, CTX), ClientSession(1, T, CTX)
    server.advertise(zero.keys)
    high = bytearray(zero.keys.mask_public)
    high[31] |= 0x80
    with pytest.raises(SecAggError, match="client 1's .*canonical"):
        server.advertise(dataclasses.replace(one.keys, mask_public=bytes(high)))
    server.advertise(one.keys)


@pytest.mark.parametrize("which", ["cipher_public", "mask_public"])
def test_h4_a_client_handed_a_low_order_roster_entry_refuses_the_session_with_a_secagg_error(which):
    """A coordinator that passes client 3's low-order key through: each honest client refuses the session with a
    SecAggError naming client 3 (the client loop sits that session out), never an exchange's bare ValueError."""
    sessions = {i: ClientSession(i, T, CTX) for i in range(N)}
    roster = {i: s.keys for i, s in sessions.items()}
    roster[3] = dataclasses.replace(roster[3], **{which: point(0)})
    for i in (0, 1, 2, 4):
        with pytest.raises(SecAggError, match="client 3's") as refused:
            sessions[i].share(dict(roster))
        assert type(refused.value) is SecAggError


# ------------------------------------------------------------------ H4: a box that does not open


def garbage_for(recipient: int, sender: int):
    def edit(i: int, sealed: dict[int, bytes], roster: dict[int, Keys]) -> dict[int, bytes]:
        return sealed | {recipient: os.urandom(BOX_BYTES)} if i == sender else sealed

    return edit


def test_h4_a_garbage_box_is_a_complaint_the_sum_stays_exact_and_its_dealer_is_named():
    """Client 4 sends client 0 random bytes of a box's size. Client 0's reveal does not raise: it answers without
    client 4's share and complains, revealing that pair's box key. The others' shares rebuild client 4's seed: the
    sum is exact. The coordinator judges the complaint: client 4 is named, client 0 is not."""
    clients, server, xs = rounds_until_inputs(boxes=garbage_for(0, 4))
    answer_all(clients, server)
    assert clients[0].complaints == [4]
    assert is_complaint(server.revealed[0][4])
    assert np.array_equal(server.result(), exact(xs))
    blamed, unresolved = server.complaint_verdicts()
    assert list(blamed) == [4] and "do not open" in blamed[4] and not unresolved


def test_h4_a_box_sealed_under_another_key_names_its_dealer():
    """Client 4 seals client 0's shares under a key of its own choosing (a well-formed box that commits to another
    key than the pair's). Client 0's own box for client 4 proves the pair's key, and client 4 opened it without
    complaint: client 4 is named, the sum exact."""
    stranger, _ = keypair()

    def wrong_key(i: int, sealed: dict[int, bytes], roster: dict[int, Keys]) -> dict[int, bytes]:
        return sealed | {0: seal(stranger, roster[0].cipher_public, 4, 0, bytes(48), CTX)} if i == 4 else sealed

    clients, server, xs = rounds_until_inputs(boxes=wrong_key)
    answer_all(clients, server)
    assert clients[0].complaints == [4]
    assert np.array_equal(server.result(), exact(xs))
    assert list(server.complaint_verdicts()[0]) == [4]


@pytest.mark.parametrize("revealed", ["the pair's key", "a key of its own"])
def test_h4_a_false_complaint_names_the_accuser_never_the_dealer(revealed):
    """Client 0 complains about client 4's honest box, revealing the pair's true key (the box opens under it) or
    another key (its own box for client 4 was not sealed under it): client 0 is named, client 4 is not; the
    sum, rebuilt without that pair's share, is exact."""
    clients, server, xs = rounds_until_inputs()

    def complain(i: int, answer: dict[int, bytes]) -> dict[int, bytes]:
        if i != 0:
            return answer
        true = box_key(clients[0].cipher_private, clients[4].keys.cipher_public, CTX)  # the pair's key
        return answer | {4: rounds.COMPLAINT + (true if revealed == "the pair's key" else os.urandom(32))}

    answer_all(clients, server, complain)
    assert np.array_equal(server.result(), exact(xs))
    blamed, _ = server.complaint_verdicts()
    assert list(blamed) == [0] and "complained" in blamed[0]


def test_h4_garbage_boxes_to_every_client_leave_the_session_failing_on_the_dealer_alone():
    """Client 4 sends garbage to every other client: nobody holds its shares, so its seed cannot be rebuilt and the
    session fails; the failure names client 4 alone (the coordinator then restarts without it)."""

    def everyone(i: int, sealed: dict[int, bytes], roster: dict[int, Keys]) -> dict[int, bytes]:
        return {j: os.urandom(BOX_BYTES) for j in sealed} if i == 4 else sealed

    clients, server, _ = rounds_until_inputs(boxes=everyone)
    answer_all(clients, server)
    with pytest.raises(rounds.Culprits) as failed:
        server.result()
    assert list(failed.value.why) == [4]


# ------------------------------------------------------------------ M1: a dealer framing its recipient


def test_m1_a_dealer_that_deals_an_honest_client_a_wrong_share_is_named_itself():
    """Client 4 deals client 0 a share of another seed than it committed to, consistent with its own box header.
    Client 0 opens it and reveals it honestly. The rebuilt seed fails its commitment: the dealer (4) is named, and
    client 0, ranked first among the answers, is not."""

    clients, server, _ = rounds_until_inputs()
    four = clients[4]
    plain = open_box(clients[0].cipher_private, four.keys.cipher_public, 4, 0, server.boxes[4][0], CTX)
    off = bytes([plain[0] ^ 1]) + plain[1:]
    server.boxes[4][0] = seal(four.cipher_private, clients[0].keys.cipher_public, 4, 0, off, CTX)
    answer_all(clients, server)
    assert not getattr(clients[0], "complaints", [])  # the box opens: nothing to complain about
    with pytest.raises(rounds.Culprits) as failed:
        server.result()
    assert list(failed.value.why) == [4], failed.value.why


def test_m1_an_answerer_that_reveals_another_share_than_dealt_is_named_whatever_its_rank():
    """Client 4 (ranked past the threshold) reveals a changed share of client 1's seed: the dealer's commitment
    to what it dealt client 4 names client 4."""
    clients, server, _ = rounds_until_inputs()

    def lie(i: int, answer: dict[int, bytes]) -> dict[int, bytes]:
        return answer | {1: bytes([answer[1][0] ^ 1]) + answer[1][1:]} if i == 4 else answer

    answer_all(clients, server, lie)
    with pytest.raises(rounds.Culprits) as failed:
        server.result()
    assert list(failed.value.why) == [4] and "wrong share of client 1" in failed.value.why[4]
