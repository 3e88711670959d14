"""Secure aggregation's primitives: fixed point on Z_2^128, pairwise and own masks that
cancel, Shamir shares, unmasking with dropped clients, and the rounds' refusals."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from common.secagg import shamir
from common.secagg.primitives import (
    FixedPoint,
    RingSum,
    SecAggError,
    combine,
    decode,
    encode,
    keypair,
    masked,
    pairwise,
    ring_add,
    ring_sub,
    ring_zeros,
    share,
    unmask,
)

CONTEXT = b"run|task 0|round 1|train"


@settings(max_examples=50, deadline=None)
@given(st.integers(1, 40), st.integers(0, 2**31 - 1))
def test_decoded_sums_equal_the_float_sums_within_the_stated_bound(clients, seed):
    fp = FixedPoint(frac_bits=64, bound=1e4)
    fp.check(clients)
    rng = np.random.default_rng(seed)
    xs = rng.uniform(-fp.bound, fp.bound, size=(clients, 17)) * 10.0 ** rng.integers(-12, 1, size=(clients, 17))
    total = ring_zeros(17)
    for x in xs:
        total = ring_add(total, encode(x, fp))
    got = decode(total, fp, clients)
    # grid rounding (stated bound) plus float64 rounding of the reference sum and of the decoding,
    # relative to each entry's own magnitude: values down to 1e-12 keep float64's precision
    eps = np.finfo(np.float64).eps
    tol = fp.error_bound(clients) + (clients + 2) * eps * np.abs(xs).sum(0)
    assert (np.abs(got - xs.sum(0)) <= tol).all()


def test_overflow_is_refused_not_wrapped():
    fp = FixedPoint(frac_bits=24, bound=1.0)
    with pytest.raises(SecAggError, match="exceeds the bound"):
        encode(np.array([1.5]), fp)
    with pytest.raises(SecAggError, match="not finite"):
        encode(np.array([np.nan]), fp)
    with pytest.raises(SecAggError, match="reaches 2\\^126"):
        FixedPoint(frac_bits=96, bound=2.0**30).check(10)
    big = np.array([[0, 2**60]], dtype=np.int64).view(np.uint64)  # no honest sum of 3 values of |x| <= 1 gets here
    with pytest.raises(SecAggError, match="beyond"):
        decode(big, fp, 3)


def clients(n: int):
    keys = {i: keypair() for i in range(n)}
    publics = {i: pub for i, (_, pub) in keys.items()}
    seeds = {i: bytes([i + 1]) * 16 for i in range(n)}
    return keys, publics, seeds


def test_pairwise_masks_cancel_in_the_sum_and_hide_each_value():
    keys, publics, _ = clients(4)
    masks = [pairwise(i, keys[i][0], publics, 9, CONTEXT) for i in range(4)]
    total = ring_zeros(9)
    for m in masks:
        total = ring_add(total, m)
    assert np.array_equal(total, ring_zeros(9))
    assert all(np.count_nonzero(m) == 18 for m in masks)
    other_step = pairwise(0, keys[0][0], publics, 9, CONTEXT + b"'")
    assert not np.array_equal(other_step, masks[0])  # a mask is bound to its step


def test_shamir_rebuilds_from_threshold_shares_only():
    secret = bytes(range(32))
    members = [3, 5, 8, 13, 21]
    shares = share(secret, 3, members)
    assert combine({c: shares[c] for c in (5, 13, 21)}, members, 3) == secret
    assert combine({c: shares[c] for c in (3, 8, 13, 21)}, members, 3) == secret
    assert combine({c: shares[c] for c in (3, 8)}, members, 2) != secret  # two shares of a 3-threshold
    with pytest.raises(SecAggError, match="3 needed"):
        combine({c: shares[c] for c in (3, 8)}, members, 3)


def test_a_step_survives_dropped_clients_and_yields_the_survivors_sum():
    n, threshold, count = 5, 3, 11
    fp = FixedPoint(frac_bits=64, bound=100.0)
    keys, publics, seeds = clients(n)
    members = list(range(n))
    key_shares = {i: share(keys[i][0], threshold, members) for i in members}
    seed_shares = {i: share(seeds[i], threshold, members) for i in members}
    rng = np.random.default_rng(0)
    values = {i: rng.uniform(-50, 50, count) for i in members}
    sent = {i: masked(encode(values[i], fp), i, keys[i][0], publics, seeds[i], CONTEXT) for i in members}
    survivors, dropped = [0, 2, 3], [1, 4]  # 1 and 4 dropped after the keys were shared, before sending
    total = ring_zeros(count)
    for i in survivors:
        total = ring_add(total, sent[i])
        # one y_i hides x_i: it looks like uniform noise on the ring, not like an encoded value
        assert (np.abs(sent[i][:, 1].view(np.int64).astype(np.float64)) > 2.0**50).mean() > 0.9
    # the survivors hand in shares: of each survivor's seed, of each dropped client's key
    rebuilt_seeds = {i: combine({s: seed_shares[i][s] for s in survivors}, members, threshold) for i in survivors}
    rebuilt_keys = {j: combine({s: key_shares[j][s] for s in survivors}, members, threshold) for j in dropped}
    assert rebuilt_keys == {j: keys[j][0] for j in dropped}
    sums = decode(unmask(total, survivors, rebuilt_keys, rebuilt_seeds, publics, CONTEXT), fp, len(survivors))
    want = sum(values[i] for i in survivors)
    assert np.abs(sums - want).max() <= fp.error_bound(len(survivors)) + 8 * np.finfo(np.float64).eps * 150


# ------------------------------------------------------------------------- the rounds


def _rounds(n: int, t: int):
    from common.secagg.client_session import ClientSession
    from common.secagg.server_session import ServerSession

    clients = {i: ClientSession(i, t, CONTEXT) for i in range(n)}
    server = ServerSession(expected=list(range(n)), threshold=t, context=CONTEXT, size=3)
    for c in clients.values():
        server.advertise(c.advertise())
    roster = server.close_keys()
    for i, c in clients.items():
        server.share(i, c.share(roster))
    return clients, server, server.close_shares()


def test_a_client_refuses_unmask_requests_that_could_reveal_an_input():
    from common.secagg.boxes import is_complaint

    """Fewer survivors than the threshold, a request that is no partition of the sharers (a client named
    both survivor and dropped would give up both its secrets), a second request. A changed sealed share is
    no reason to refuse: its share is left out and the answer complains about its sender."""
    clients, server, sharers = _rounds(4, 3)
    for i in range(4):
        clients[i].mask(ring_zeros(3), sharers)
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        clients[0].reveal(server.inbox(0), [0, 1], [2, 3])
    with pytest.raises(SecAggError, match="not a partition"):
        clients[0].reveal(server.inbox(0), [0, 1, 2], [2, 3])
    inbox = server.inbox(0)
    inbox[1] = inbox[1][:-1] + bytes([inbox[1][-1] ^ 1])
    answer = clients[0].reveal(inbox, [0, 1, 2], [3])
    assert is_complaint(answer[1]) and clients[0].complaints == [1] and len(answer[2]) == 16
    clients[1].reveal(server.inbox(1), [0, 1, 2], [3])
    with pytest.raises(SecAggError, match="answered"):
        clients[1].reveal(server.inbox(1), [0, 1, 2], [3])


def test_the_rounds_give_the_survivors_sum_and_refuse_late_or_foreign_messages():
    from common.secagg.rounds import Keys

    clients, server, sharers = _rounds(5, 3)
    xs = {i: np.array([[i, 0], [10 * i, 3], [2**63 + i, 2**63]], dtype=np.uint64) for i in range(5)}
    for i in (0, 2, 3):  # 1 and 4 drop after sharing
        server.masked_input(i, clients[i].mask(xs[i], sharers))
    server.masked_input(0, clients[0].mask(xs[0], sharers))  # a retry: added once
    survivors, dropped = server.close_inputs()
    assert (survivors, dropped) == ([0, 2, 3], [1, 4])
    with pytest.raises(SecAggError, match="outside the input round"):
        server.masked_input(1, clients[1].mask(xs[1], sharers))
    for i in survivors:
        server.reveal(i, clients[i].reveal(server.inbox(i), survivors, dropped))
    assert np.array_equal(server.result(), ring_add(ring_add(xs[0], xs[2]), xs[3]))
    with pytest.raises(SecAggError, match="after the roster was fixed"):
        server.advertise(Keys(4, b"\x00" * 32, b"\x00" * 32))


@settings(max_examples=50, deadline=None)
@given(st.lists(st.integers(-(2**127), 2**127 - 1), min_size=1, max_size=6), st.integers(-(2**127), 2**127 - 1))
def test_ring_arithmetic_is_integer_arithmetic_modulo_2_128(values, other):
    """Addition with carry and subtraction agree with Python's integers mod 2^128."""

    def limbs(v: int) -> np.ndarray:
        v %= 2**128
        return np.array([[v % 2**64, v >> 64]], dtype=np.uint64)

    def value(a: np.ndarray) -> int:
        return int(a[0, 0]) + (int(a[0, 1]) << 64)

    total = ring_zeros(1)
    for v in values:
        total = ring_add(total, limbs(v))
    assert value(total) == sum(values) % 2**128
    assert value(ring_sub(total, limbs(other))) == (sum(values) - other) % 2**128


@settings(max_examples=50, deadline=None)
@given(
    st.lists(
        st.tuples(st.sampled_from([+1, -1]), st.lists(st.integers(0, 2**128 - 1), min_size=3, max_size=3)),
        min_size=1,
        max_size=8,
    )
)
def test_a_ring_sum_is_the_signed_integer_sum_modulo_2_128(terms):
    """The carry-once accumulator agrees with Python's integers, extremes included (all digits 2^32 - 1)."""
    total = RingSum(3)
    for sign, row in terms:
        total.add(np.array([[v % 2**64, v >> 64] for v in row], dtype=np.uint64), sign)
    got = total.value()
    for k in range(3):
        want = sum(sign * row[k] for sign, row in terms) % 2**128
        assert int(got[k, 0]) + (int(got[k, 1]) << 64) == want
    with pytest.raises(SecAggError, match="expected 3"):
        total.add(ring_zeros(2))


def _slow_multiply(a: int, b: int) -> int:
    """GF(2^16) by the definition: carry-less product, reduced by x^16 + x^12 + x^3 + x + 1."""
    product = 0
    for bit in range(16):
        if b >> bit & 1:
            product ^= a << bit
    for bit in range(31, 15, -1):
        if product >> bit & 1:
            product ^= shamir.POLYNOMIAL << (bit - 16)
    return product


@given(a=st.integers(0, 2**16 - 1), b=st.integers(0, 2**16 - 1))
@settings(max_examples=200, deadline=None)
def test_the_fields_tables_multiply_as_the_definition(a, b):
    assert int(shamir.multiply(np.array([a]), np.array([b]))[0]) == _slow_multiply(a, b)


@given(
    threshold=st.integers(1, 12),
    extra=st.integers(0, 6),
    secret=st.binary(min_size=32, max_size=32),
    seed=st.integers(0, 2**16),
)
@settings(max_examples=40, deadline=None)
def test_any_threshold_of_the_shares_rebuild_the_secret_by_the_definitions_coefficients(threshold, extra, secret, seed):
    """Any ``t`` of the dealt shares rebuild the secret, whichever are chosen; the interpolation's coefficients at
    zero are the definition's, ``l_j(0) = prod x_m / (x_j + x_m)``, checked in the slow field at random x."""
    rng = np.random.default_rng(seed)
    clients = sorted(int(c) for c in rng.choice(1000, size=threshold + extra, replace=False))
    pieces = share(secret, threshold, clients)
    chosen = sorted(int(c) for c in rng.choice(clients, size=threshold, replace=False))
    assert combine({c: pieces[c] for c in chosen}, clients, threshold) == secret
    xs = tuple(int(x) for x in rng.choice(np.arange(1, 2**16), size=threshold, replace=False))
    coefficients = shamir.lagrange_at_zero(xs)
    for j, xj in enumerate(xs):  # l_j(0) = prod x_m / (x_j + x_m), by the slow field
        num, den = 1, 1
        for m, xm in enumerate(xs):
            if m != j:
                num, den = _slow_multiply(num, xm), _slow_multiply(den, xj ^ xm)
        assert _slow_multiply(int(coefficients[j]), den) == num
