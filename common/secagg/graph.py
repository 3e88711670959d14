"""Secure aggregation's communication graph: whom each client shares with and masks against.

The complete graph of Bonawitz et al. 2017 makes each client's work and bytes grow with ``n``. SecAgg+ (Bell et
al., CCS 2020) keeps the guarantees with ``k = O(log n)`` neighbours each, on a Harary graph ``H(n, k)`` whose
nodes are placed on its ring by a random permutation: client ``i`` neighbours the ``k / 2`` clients on each side of
its ring position. Each client Shamir-shares its secrets among its closed neighbourhood (its neighbours and
itself, threshold ``t`` of those that advertised), masks pairwise against its neighbours only, and the coordinator
rebuilds only what the survivors' neighbourhoods need.

**Public randomness.** The permutation is drawn from SHA-256 of the step's context (run, task, round, phase,
session) and ``n``: every client computes its own neighbourhood, and none takes it from the coordinator, so no
client can be shown another graph than its neighbours are. What a coordinator that deviates can still choose,
and what stops it, is docs/RELIABILITY.md's.

**Parameters** (:func:`derive`). For ``n`` clients, a target dropout rate ``delta`` (a uniformly random set of
``ceil(delta n)`` clients vanishes) and a target corruption rate ``gamma`` (``floor(gamma n)`` clients, fixed
independently of the graph's seed, collude with the coordinator), the least even ``k`` for which, with ``c`` the
most corrupt neighbours any client has and ``t = k / 2 + c + 2``:

- *privacy*: ``n P[Hyp(n - 1, floor(gamma n), k) > c] <= 2^-(bits + 1)`` (union bound over the clients): no
  client has more than ``c`` corrupt neighbours, so fewer than ``t`` shares of any secret are known to them;
- *correctness*: ``n P[Hyp(n - 1, ceil(delta n), k) > k - t] <= 2^-(bits + 1)``: every client keeps ``t``
  surviving holders of its shares, so each survivor's seed and each dropped client's key can be rebuilt.

Both hold together with probability at least ``1 - 2^-bits`` (``secagg.failure_bits``, 40 by default). The
threshold above half the neighbourhood plus the corrupt bound is what makes it safe against a coordinator that
lies about who dropped: the survivors' subgraph of honest clients is disconnected only if some honest survivor
borders a run of ``k / 2`` ring positions without one, and that survivor then has at most ``k / 2 + 1 + c < t``
answering holders, so no sum at all can be unmasked, nor the sum of a part; and two unmask requests that
disagree about one client would need ``2t - c > k + 1`` of its holders. A derived ``k >= n - 1`` is the complete
graph, with the complete graph's threshold.
"""

from __future__ import annotations

import functools
import hashlib
import math
import struct
from dataclasses import dataclass

from common.secagg.primitives import SecAggError

SPARSE_FROM = 300  # secagg.graph = auto: sparse from this many clients (why: docs/BENCHMARKS.md, "A thousand clients")


def _log_hypergeometric(population: int, successes: int, draws: int, x: int) -> float:
    """``log P[X = x]`` for ``X ~ Hyp(population, successes, draws)``."""

    def log_comb(a: int, b: int) -> float:
        return math.lgamma(a + 1) - math.lgamma(b + 1) - math.lgamma(a - b + 1)

    return log_comb(successes, x) + log_comb(population - successes, draws - x) - log_comb(population, draws)


def tail(population: int, successes: int, draws: int, above: int) -> float:
    """``P[X > above]`` for ``X ~ Hyp(population, successes, draws)``: the chance that more than ``above`` of
    ``draws`` clients drawn without replacement from ``population`` are among ``successes`` marked ones."""
    top = min(successes, draws)
    low = max(above + 1, draws - (population - successes))
    if low > top:
        return 0.0
    return sum(math.exp(_log_hypergeometric(population, successes, draws, x)) for x in range(low, top + 1))


def _least_above(population: int, successes: int, draws: int, bound: float) -> int:
    """The least ``c`` with ``P[X > c] <= bound`` for ``X ~ Hyp(population, successes, draws)``."""
    top = min(successes, draws)
    above = 0.0  # P[X > c], summed down from the top
    for c in range(top, -1, -1):
        # P[X > c - 1] = P[X > c] + P[X = c]
        if above + math.exp(_log_hypergeometric(population, successes, draws, c)) > bound:
            return c
        above += math.exp(_log_hypergeometric(population, successes, draws, c))
    return 0


@dataclass(frozen=True)
class Parameters:
    """A sparse graph's sizes for ``n`` clients: ``k`` neighbours each, the threshold ``t`` of a closed
    neighbourhood's ``k + 1`` holders, ``c`` the corrupt neighbours allowed, ``dropped`` the dropped neighbours
    allowed, and ``failure`` the bound on the chance that either is exceeded (:func:`derive`)."""

    n: int
    k: int
    t: int
    c: int
    dropped: int
    failure: float
    dropout: float
    corrupt: float

    @property
    def complete(self) -> bool:
        return self.k >= self.n - 1


@functools.lru_cache(maxsize=256)
def derive(n: int, dropout: float, corrupt: float, bits: int = 40) -> Parameters:
    """The least even ``k`` (and ``t``, ``c``) meeting both bounds of the module's docstring at ``2^-bits``; a
    ``k`` of ``n - 1`` (complete) when no smaller one does."""
    if n < 2 or not 0 <= dropout < 1 or not 0 <= corrupt < 1 or bits < 1:
        raise SecAggError(f"graph parameters for {n} clients, dropout {dropout}, corrupt {corrupt}, 2^-{bits}")
    each = 2.0 ** -(bits + 1) / n  # per client and per bound: the union bound over n clients and two events
    corrupted, vanished = math.floor(corrupt * n), math.ceil(dropout * n)
    for k in range(2, n - 1, 2):
        c = _least_above(n - 1, corrupted, k, each)
        t = k // 2 + c + 2
        allowed = k - t  # dropped neighbours a dropped client may have and still keep t holders
        if allowed < 0:
            continue
        p_drop = tail(n - 1, vanished, k, allowed)
        if p_drop <= each:
            return Parameters(n, k, t, c, allowed, n * (p_drop + tail(n - 1, corrupted, k, c)), dropout, corrupt)
    return Parameters(n, n - 1, 0, 0, 0, 0.0, dropout, corrupt)


class _Stream:
    """SHA-256 in counter mode over ``seed``: uniform integers below a bound, by rejection (no modulo bias)."""

    def __init__(self, seed: bytes) -> None:
        self.seed, self.counter, self.buffer = seed, 0, b""

    def below(self, bound: int) -> int:
        if bound <= 1:
            return 0
        bits = (bound - 1).bit_length()
        size = (bits + 7) // 8
        while True:
            while len(self.buffer) < size:
                self.buffer += hashlib.sha256(self.seed + struct.pack(">Q", self.counter)).digest()
                self.counter += 1
            value = int.from_bytes(self.buffer[:size], "big") >> (8 * size - bits)
            self.buffer = self.buffer[size:]
            if value < bound:
                return value


def graph_seed(context: bytes, n: int) -> bytes:
    """The public randomness of a step's graph: SHA-256 of its context and its number of clients."""
    return hashlib.sha256(b"lorm-secagg-graph|" + struct.pack(">I", n) + context).digest()


@dataclass(frozen=True)
class Graph:
    """Who neighbours whom among clients ``0 .. n - 1``, and the threshold of a closed neighbourhood.

    ``k = n - 1``: the complete graph (every client neighbours every other). Else the Harary graph ``H(n, k)``
    on the ring ``order`` (ring position -> client): each client neighbours the ``k / 2`` on either side."""

    n: int
    k: int
    threshold: int
    order: tuple[int, ...] = ()

    @property
    def complete(self) -> bool:
        return self.k >= self.n - 1

    @functools.cached_property
    def _position(self) -> dict[int, int]:
        return {client: p for p, client in enumerate(self.order)}

    def neighbours(self, i: int) -> list[int]:
        """Client ``i``'s neighbours, sorted (never ``i``)."""
        if self.complete:
            return [j for j in range(self.n) if j != i]
        p, half = self._position[i], self.k // 2
        return sorted(self.order[(p + d) % self.n] for d in range(-half, half + 1) if d)

    def closed(self, i: int) -> list[int]:
        """Client ``i``'s closed neighbourhood: the holders of its shares (its neighbours and itself), sorted."""
        return sorted([*self.neighbours(i), i])

    def adjacent(self, i: int, j: int) -> bool:
        if self.complete:
            return i != j
        d = abs(self._position[i] - self._position[j])
        return 0 < min(d, self.n - d) <= self.k // 2

    @staticmethod
    def full(n: int, threshold: int) -> Graph:
        return Graph(n, n - 1, threshold)

    @staticmethod
    def sparse(params: Parameters, context: bytes) -> Graph:
        """The Harary graph of ``params`` on the ring drawn from the step's public randomness (:func:`graph_seed`)."""
        order = list(range(params.n))
        stream = _Stream(graph_seed(context, params.n))
        for i in range(params.n - 1, 0, -1):  # Fisher-Yates
            j = stream.below(i + 1)
            order[i], order[j] = order[j], order[i]
        return Graph(params.n, params.k, params.t, tuple(order))
