"""Secure aggregation on the sparse graph: its parameters, its graph, the sum exact under dropouts in both modes,
and the attacks a coordinator that deviates can try on a graph of neighbourhoods."""

from __future__ import annotations

import math
import os

import numpy as np
import pytest

from common.run.settings import SecAggSettings
from common.secagg.blame import check_blame
from common.secagg.client_session import ClientSession
from common.secagg.graph import Graph, derive, tail
from common.secagg.primitives import FixedPoint, SecAggError, encode, ring_add, ring_zeros
from common.secagg.rounds import BOX_BYTES, Culprits
from common.secagg.server_session import ServerSession
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import sparse_parameters, step_graph, threshold
from server.certs import create_dev_pki

CONTEXT = b"run|0|0|train"
FP = FixedPoint(frac_bits=40, bound=2.0**20)
SIZE = 24


@pytest.mark.parametrize("n,dropout,corrupt", [(200, 0.1, 0.0), (1000, 0.1, 0.05), (1000, 0.3, 0.0), (300, 0.1, 0.1)])
def test_parameters_meet_both_bounds_at_the_target(n, dropout, corrupt):
    p = derive(n, dropout, corrupt, 40)
    assert not p.complete and p.k % 2 == 0 and p.t == p.k // 2 + p.c + 2 and p.dropped == p.k - p.t
    each = 2.0**-41 / n
    assert tail(n - 1, math.floor(corrupt * n), p.k, p.c) <= each  # no neighbourhood holds more than c corrupt
    assert tail(n - 1, math.ceil(dropout * n), p.k, p.dropped) <= each  # nor more than k - t dropped
    assert p.failure <= 2.0**-40
    smaller = derive.__wrapped__(n, dropout, corrupt, 20)  # a weaker target never needs more neighbours
    assert smaller.k <= p.k


def test_tail_is_the_hypergeometric_law():
    population, marked, draws = 30, 7, 9
    exact = sum(math.comb(marked, x) * math.comb(population - marked, draws - x) for x in range(3, 8))
    assert tail(population, marked, draws, 2) == pytest.approx(exact / math.comb(population, draws), rel=1e-9)


def test_few_clients_fall_back_to_the_complete_graph():
    settings = SecAggSettings(enabled=True, graph="sparse", dropout=0.3, corrupt=0.05)
    assert derive(10, 0.3, 0.05).complete
    assert sparse_parameters(settings, 10) is None
    assert step_graph(settings, 10, CONTEXT).complete and threshold(settings, 10) == 6
    auto = SecAggSettings(enabled=True)
    assert sparse_parameters(auto, 299) is None and sparse_parameters(auto, 300) is not None


def test_sparse_graph_refuses_a_threshold_of_its_own():
    with pytest.raises(SecAggError, match="derived per neighbourhood"):
        threshold(SecAggSettings(enabled=True, graph="sparse", threshold=90), 400)


def test_the_graph_is_regular_symmetric_and_drawn_from_the_context():
    params = derive(200, 0.1, 0.05)
    g = Graph.sparse(params, CONTEXT)
    assert sorted(g.order) == list(range(200))
    for i in range(200):
        near = g.neighbours(i)
        assert len(near) == params.k and i not in near
        assert all(i in g.neighbours(j) and g.adjacent(i, j) for j in near)
    assert Graph.sparse(params, CONTEXT) == g  # every party draws the same
    other = Graph.sparse(params, CONTEXT + b"|attempt 1")
    assert other.order != g.order  # a new session, a new graph
    # No ring position is favoured: over many contexts client 0 lands everywhere about as often
    positions = [Graph.sparse(derive(20, 0.1, 0.0), b"c%d" % s).order.index(0) for s in range(2000)]
    counts = np.bincount(positions, minlength=20)
    assert counts.min() > 50 and counts.max() < 150


def _pki(tmp_path, n: int) -> tuple[dict[int, Signer], Verifier]:
    pki = create_dev_pki(str(tmp_path), [f"c{i}" for i in range(n)])
    return {i: Signer.from_files(pki.client_cert(f"c{i}"), pki.client_key(f"c{i}")) for i in range(n)}, Verifier(pki.ca)


class Run:
    """One step's sessions on ``graph``: the clients and the coordinator, driven round by round."""

    def __init__(self, graph: Graph, signers: dict[int, Signer] | None = None, verifier: Verifier | None = None):
        n = graph.n
        self.graph = graph
        self.clients = {
            i: ClientSession(i, graph.threshold, CONTEXT, (signers or {}).get(i), verifier, graph=graph)
            for i in range(n)
        }
        check = None if verifier is None else verifier.verify
        self.server = ServerSession(
            list(range(n)), graph.threshold, CONTEXT, SIZE, signed=verifier is not None, check=check, graph=graph
        )
        rng = np.random.default_rng(7)
        self.values = {i: encode(rng.normal(size=SIZE), FP) for i in range(n)}

    def share(self, edit=lambda i, boxes: boxes) -> None:
        for c in self.clients.values():
            self.server.advertise(c.advertise())
        self.server.close_keys()
        for i, c in self.clients.items():
            boxes = c.share(self.server.roster_for(i))
            assert sorted(boxes) == self.graph.neighbours(i)  # k boxes, not n - 1
            self.server.share(i, edit(i, boxes))
        self.server.close_shares()

    def mask(self, gone: set[int]) -> None:
        for i, c in self.clients.items():
            if i not in gone:
                self.server.masked_input(i, c.mask(self.values[i], self.server.sharers))

    def answer(self, signed: bool, edit=lambda i, answer: answer, silent: frozenset[int] = frozenset()) -> None:
        """Every survivor answers the unmask request but those ``silent`` (gone after their masked input)."""
        survivors, dropped = self.server.close_inputs()
        if signed:
            for i in survivors:
                if i not in silent:
                    self.server.confirm(i, self.clients[i].confirm(survivors, dropped))
            assert self.server.confirmed(late=True)
        for i in survivors:
            if i in silent:
                continue
            mine = {j: s for j, s in self.server.confirmations.items() if j in self.graph.closed(i)}
            answer = self.clients[i].reveal(self.server.inbox(i), survivors, dropped, mine if signed else None)
            self.server.reveal(i, edit(i, answer))

    def expected(self, gone: set[int]) -> np.ndarray:
        total = ring_zeros(SIZE)
        for i, v in self.values.items():
            if i not in gone:
                total = ring_add(total, v)
        return total


@pytest.mark.parametrize("mode", ["honest", "signed"])
@pytest.mark.parametrize("dropout", [0.1, 0.3])
def test_the_sum_is_exact_with_a_share_of_clients_gone(tmp_path, mode, dropout):
    n = 40
    settings = SecAggSettings(enabled=True, graph="sparse", dropout=dropout, corrupt=0.0, mode=mode)
    graph = step_graph(settings, n, CONTEXT)
    assert not graph.complete and graph.k < n - 1
    signers, verifier = _pki(tmp_path, n) if mode == "signed" else (None, None)
    run = Run(graph, signers, verifier)
    run.share()
    gone = set(np.random.default_rng(3).choice(n, size=int(dropout * n), replace=False).tolist())
    run.mask(gone)
    run.answer(mode == "signed")
    np.testing.assert_array_equal(run.server.result(), run.expected(gone))


@pytest.mark.parametrize(
    ("mode", "n", "share"),
    [
        ("honest", 40, 0.1),
        ("honest", 40, 0.3),
        ("signed", 40, 0.3),
        pytest.param("honest", 300, 0.3, marks=pytest.mark.slow),  # 90 silent: about 15 s here
    ],
)
def test_the_sum_is_exact_with_a_share_of_clients_gone_after_their_masked_input(tmp_path, mode, n, share):
    """Clients that vanish between their masked input and the unmask: their inputs are in the sum (the others'
    shares rebuild their own-mask seeds), and the step closes late with the answers of the rest, on a graph sized
    for that share of dropouts."""
    settings = SecAggSettings(enabled=True, graph="sparse", dropout=share, corrupt=0.0, mode=mode)
    graph = step_graph(settings, n, CONTEXT)
    assert not graph.complete
    signers, verifier = _pki(tmp_path, n) if mode == "signed" else (None, None)
    run = Run(graph, signers, verifier)
    run.share()
    run.mask(set())
    silent = frozenset(np.random.default_rng(5).choice(n, size=int(share * n), replace=False).tolist())
    run.answer(mode == "signed", silent=silent)
    assert not run.server.ready() and run.server.ready(late=True)  # not all answered; enough in every neighbourhood
    np.testing.assert_array_equal(run.server.result(), run.expected(set()))


def _sparse(n: int = 40) -> Graph:
    return step_graph(SecAggSettings(enabled=True, graph="sparse", dropout=0.1, corrupt=0.0), n, CONTEXT)


def test_a_roster_naming_a_client_outside_the_neighbourhood_is_refused():
    """The coordinator cannot choose who neighbours whom: each client draws the graph itself."""
    graph = _sparse()
    run = Run(graph)
    for c in run.clients.values():
        run.server.advertise(c.advertise())
    roster = run.server.close_keys()
    stranger = next(j for j in range(graph.n) if j != 0 and j not in graph.neighbours(0))
    with pytest.raises(SecAggError, match="not client 0's neighbours"):
        run.clients[0].share(run.server.roster_for(0) | {stranger: roster[stranger]})


def test_declaring_a_clients_neighbours_dropped_unmasks_nothing():
    """Isolation: a coordinator that names every neighbour of a target dropped, so that the target's input would be
    its component's sum. The target refuses (too few survivors around it), honest neighbours named dropped answer
    nothing, and with no answers for the target's seed the coordinator rebuilds nothing of it."""
    graph = _sparse()
    run = Run(graph)
    run.share()
    run.mask(set())
    target = 5
    dropped = graph.neighbours(target)
    survivors = [i for i in range(graph.n) if i not in dropped]
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        run.clients[target].reveal(run.server.inbox(target), survivors, dropped)
    for j in dropped:
        with pytest.raises(SecAggError, match="fewer than the threshold|among the dropped"):
            run.clients[j].reveal(run.server.inbox(j), survivors, dropped)
    answered = 0
    for i in survivors:
        try:
            answer = run.clients[i].reveal(run.server.inbox(i), survivors, dropped)
        except SecAggError:
            continue
        answered += 1
        assert target not in answer  # the target's shares are held by its neighbourhood alone
    assert answered > 0


def test_a_request_confirmed_by_too_few_neighbours_reveals_nothing(tmp_path):
    """Signed mode, split requests: a client reveals only once the threshold of its own neighbourhood signed the very
    request it signed; signatures of clients elsewhere on the ring do not count."""
    graph = _sparse(24)
    signers, verifier = _pki(tmp_path, graph.n)
    run = Run(graph, signers, verifier)
    run.share()
    run.mask(set())
    survivors, dropped = run.server.close_inputs()
    signatures = {i: run.clients[i].confirm(survivors, dropped) for i in survivors}
    me = 0
    far = {j: s for j, s in signatures.items() if j not in graph.closed(me)}
    near = {j: s for j, s in signatures.items() if j in graph.closed(me)}
    few = dict(list(near.items())[: graph.threshold - 1])
    with pytest.raises(SecAggError, match="fewer than the threshold"):
        run.clients[me].reveal(run.server.inbox(me), survivors, dropped, far | few)
    assert run.clients[me].reveal(run.server.inbox(me), survivors, dropped, near)  # the threshold's own: it answers


# ------------------------------------------------------------------ the complete graph's attacks, on the sparse one


def test_a_garbage_box_to_a_neighbour_is_a_complaint_the_sum_stays_exact_and_its_dealer_is_named():
    graph = _sparse()
    run = Run(graph)
    dealer, victim = 3, graph.neighbours(3)[0]
    run.share(lambda i, boxes: boxes | {victim: os.urandom(BOX_BYTES)} if i == dealer else boxes)
    run.mask(set())
    run.answer(False)
    assert run.clients[victim].complaints == [dealer]
    np.testing.assert_array_equal(run.server.result(), run.expected(set()))
    blamed, unresolved = run.server.complaint_verdicts()
    assert list(blamed) == [dealer] and not unresolved


def test_an_answerer_revealing_another_share_than_dealt_is_named():
    graph = _sparse()
    run = Run(graph)
    run.share()
    run.mask(set())
    liar = 7
    owner = graph.neighbours(liar)[0]
    run.answer(False, lambda i, a: a | {owner: bytes([a[owner][0] ^ 1]) + a[owner][1:]} if i == liar else a)
    with pytest.raises(Culprits) as failed:
        run.server.result()
    assert list(failed.value.why) == [liar] and f"wrong share of client {owner}" in failed.value.why[liar]


def test_a_dealer_of_another_seed_is_proven_by_its_own_signatures_among_its_neighbours(tmp_path):
    graph = _sparse(24)
    signers, verifier = _pki(tmp_path, graph.n)
    run = Run(graph, signers, verifier)
    dealer = 2
    run.clients[dealer].seed = os.urandom(16)  # committed to the first seed at advertise, dealt and masked with this
    run.share()
    run.mask(set())
    run.answer(True)
    with pytest.raises(Culprits) as caught:
        run.server.result()
    assert list(caught.value.why) == [dealer] and "its own signatures prove it" in caught.value.why[dealer]
    proof = caught.value.proofs[dealer]
    assert check_blame(proof, verifier, CONTEXT, graph.threshold) == dealer
    assert set(map(int, proof["entries"])) <= set(graph.neighbours(dealer))  # its shares were dealt there alone
