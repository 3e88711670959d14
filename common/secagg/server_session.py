"""Secure aggregation, the coordinator's side of one step: :class:`ServerSession`, round by round.

It holds the roster, the relayed boxes and the running masked sum; each round's method checks what arrives
for form before it is stored, and :meth:`ServerSession.result` removes the masks from the sum. Whom the
unmask answers show wrong is ``verdicts.py``'s (:class:`~common.secagg.verdicts.Verdicts`, which this class
extends); what the coordinator persists of a session, ``persistence.py``'s; the client's side,
``client_session.py``'s. The coordinator runs it over the wire in ``server/secure/step.py``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass, field

import numpy as np

from common.secagg.blame import check_entry, key_matches, seed_matches, split_signed
from common.secagg.boxes import is_complaint
from common.secagg.graph import Graph
from common.secagg.primitives import RingSum, SecAggError, ring_zeros, unmask
from common.secagg.rounds import (
    BOX_BYTES,
    BOX_HEADER_BYTES,
    MAX_SIGNATURE_BYTES,
    SIGNED_SUFFIX_MIN,
    Check,
    Culprits,
    Keys,
    check_distinct,
    key_fingerprints,
)
from common.secagg.verdicts import Verdicts, rebuild


@dataclass
class ServerSession(Verdicts):
    """The coordinator's side of one step: the roster, relayed sealed shares, the running masked sum.

    It never holds an individual client's unmasked input: only the sum of masked inputs, and at the
    end the seeds of survivors and keys of dropped clients, which remove masks from the sum only.
    """

    expected: list[int]
    threshold: int
    context: bytes
    size: int = 0  # ring elements per input (0: set by the first input)
    keys: dict[int, Keys] = field(default_factory=dict)
    roster: dict[int, Keys] | None = None  # U1, fixed by close_keys
    boxes: dict[int, dict[int, bytes]] = field(default_factory=dict)  # sender -> recipient -> sealed shares
    sharers: list[int] | None = None  # U2
    # the masked inputs' sum so far (carried once, when read: :attr:`total`)
    _sum: RingSum | None = field(default=None, init=False, repr=False, compare=False)
    inputs: list[int] = field(default_factory=list)  # U3 so far
    survivors: list[int] | None = None
    revealed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # answerer -> owner -> share or complaint
    confirmations: dict[int, bytes] = field(default_factory=dict)  # signed mode: survivor -> its signed request
    received: dict[str, int] = field(default_factory=dict)  # round -> bytes the clients sent in it
    prints: dict[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False)  # keys' fingerprints (a cache)
    signed: bool = False  # the signed mode: boxes and answers carry their dealers' signatures (verifiable blame)
    # Signed mode: checks a signature under a roster certificate (the caller's: the run CA's when it has it), for an
    # answer's header unlike the relayed box's and for a proof's shares. None: not checked here (the clients check
    # them); their form, the x-coordinates and the shares' commitments still are.
    check: Check | None = field(default=None, repr=False, compare=False)
    # Who shares with and masks against whom (``common/secagg/graph.py``): None, or a complete graph, is every client
    # of the roster; a sparse graph, each client's closed neighbourhood, and ``threshold`` is a neighbourhood's.
    graph: Graph | None = field(default=None, repr=False, compare=False)
    _owners: dict[bytes, int] = field(default_factory=dict, repr=False, compare=False)  # key fingerprint -> client

    def __post_init__(self) -> None:
        if not 1 <= self.threshold <= len(self.expected):
            raise SecAggError(f"threshold {self.threshold} for {len(self.expected)} clients")
        if self.graph is not None and self.graph.complete:
            self.graph = None

    def near(self, i: int) -> list[int] | None:
        """Client ``i``'s closed neighbourhood (``None``: the complete graph, everyone)."""
        return None if self.graph is None else self.graph.closed(i)

    def holders(self, owner: int) -> list[int]:
        """The clients of the roster that hold ``owner``'s shares, in the order that fixes their x-coordinates."""
        assert self.roster is not None
        near = self.near(owner)
        return sorted(self.roster) if near is None else [j for j in near if j in self.roster]

    def roster_for(self, i: int) -> dict[int, Keys]:
        """The roster as client ``i`` receives it: its neighbourhood's keys (every client's on the complete graph)."""
        assert self.roster is not None
        return {j: self.roster[j] for j in self.holders(i)}

    def enough(self, answered: set[int] | list[int]) -> bool:
        """Whether a round may close late with ``answered``: at least the threshold, and on a sparse graph the
        threshold within each answering client's closed neighbourhood too (fewer there, that client would refuse to
        go on, or its secrets could not be rebuilt; the round waits for more instead)."""
        done = set(answered)
        return len(done) >= self.threshold and self._around(done, done)

    def _around(self, answered: set[int], owners: set[int] | list[int]) -> bool:
        """Whether each of ``owners`` has the threshold of ``answered`` in its closed neighbourhood (always, on the
        complete graph, once ``answered`` holds the threshold)."""
        if self.graph is None:
            return True
        return all(sum(j in answered for j in self.graph.closed(i)) >= self.threshold for i in owners)

    def _adjacent(self, i: int, j: int) -> bool:
        return self.graph is None or self.graph.adjacent(i, j)

    def _count(self, round_: str, nbytes: int) -> None:
        self.received[round_] = self.received.get(round_, 0) + nbytes

    def _need(self, enough: int, what: str) -> None:
        if enough < self.threshold:
            raise SecAggError(f"{what}: {enough} clients, fewer than the threshold {self.threshold}: the step fails")

    def advertise(self, keys: Keys) -> None:
        """``keys`` of client ``keys.index``: the caller must have checked that this index is the caller's."""
        if self.roster is not None:
            raise SecAggError(f"client {keys.index} advertised keys after the roster was fixed")
        if keys.index not in self.expected:
            raise SecAggError(f"client {keys.index} is not one of this step's clients")
        prints = key_fingerprints(keys)  # sizes; no low-order or non-canonical point (each peer would raise on it)
        if keys.index in self.keys:
            if self.keys[keys.index] != keys:
                raise SecAggError(f"client {keys.index} advertised different keys twice")
            return
        for i, k in self.keys.items():
            if i not in self.prints:  # a resumed session's keys: fingerprinted once
                self.prints[i] = key_fingerprints(k)
        if len(self._owners) != 2 * len(self.keys):  # resumed, or keys set from outside: index them once
            check_distinct(self.keys, self.prints)
            self._owners = {p: i for i in self.keys for p in self.prints[i]}
        for p in prints:  # a copied key (up to a low-order component): refused, without a pass over every key
            if p in self._owners or prints[0] == prints[1]:
                first = self._owners.get(p, keys.index)
                raise SecAggError(f"clients {first} and {keys.index} advertised the same public key")
        self._owners |= {p: keys.index for p in prints}
        self.keys[keys.index] = keys
        self.prints[keys.index] = prints
        self._count(
            "advertise",
            sum(map(len, (keys.cipher_public, keys.mask_public, keys.commitment, keys.certificate, keys.signature))),
        )

    def close_keys(self) -> dict[int, Keys]:
        """Fix ``U1``: the clients that advertised."""
        if self.roster is None:
            self._need(len(self.keys), "advertised keys")
            self.roster = dict(sorted(self.keys.items()))
        return self.roster

    def share(self, sender: int, boxes: dict[int, bytes]) -> None:
        if self.roster is None or sender not in self.roster or self.sharers is not None:
            raise SecAggError(f"client {sender}'s shares arrived outside the share round or from outside the roster")
        holders = self.holders(sender)
        if sorted(boxes) != [j for j in holders if j != sender]:
            where = "roster" if self.graph is None else "roster among its neighbours"
            raise SecAggError(f"client {sender} must send shares to each other client of the {where}, once")
        sizes = {len(b) for b in boxes.values()}
        if not self.signed and sizes - {BOX_BYTES}:
            raise SecAggError(
                f"client {sender}'s sealed shares must be {BOX_BYTES} bytes each, got sizes {sorted(sizes)}"
            )
        if self.signed:  # the signatures: each recipient checks its own (n - 1 a client, not n^2 here)
            position = {j: k + 1 for k, j in enumerate(holders)}
            for j, b in sorted(boxes.items()):
                _, _, at, _ = split_signed(b, BOX_BYTES)
                if at != position[j]:
                    raise SecAggError(
                        f"client {sender}'s box for client {j} names x-coordinate {at}, not its place {position[j]}"
                    )
        self.boxes[sender] = dict(boxes)
        self._count("share", sum(len(b) for b in boxes.values()))

    def close_shares(self) -> list[int]:
        """Fix ``U2``: the clients that sent their shares."""
        if self.sharers is None:
            self._need(len(self.boxes), "shared keys")
            self.sharers = sorted(self.boxes)
        return self.sharers

    def inbox(self, recipient: int) -> dict[int, bytes]:
        """The sealed shares ``U2``'s clients sent ``recipient`` (on a sparse graph, its neighbours')."""
        assert self.sharers is not None
        return {i: self.boxes[i][recipient] for i in self.sharers if i != recipient and recipient in self.boxes[i]}

    def masked_input(self, sender: int, y: np.ndarray) -> None:
        if self.sharers is None or sender not in self.sharers or self.survivors is not None:
            raise SecAggError(f"client {sender}'s masked input arrived outside the input round or it did not share")
        if sender in self.inputs:
            return  # a retry of an input already added (idempotent)
        y = np.asarray(y, dtype=np.uint64)
        if not self.size and y.ndim == 2:
            self.size = len(y)
        if y.shape != (self.size, 2):
            raise SecAggError(f"client {sender}'s masked input has shape {y.shape}, the step's sums ({self.size}, 2)")
        if self._sum is None:
            self._sum = RingSum(self.size)
        self._sum.add(y)
        self.inputs.append(sender)
        self._count("masked", y.nbytes)

    @property
    def total(self) -> np.ndarray:
        """The sum of the masked inputs so far, ``(size, 2)`` ring limbs."""
        return self._sum.value() if self._sum is not None else ring_zeros(self.size)

    def close_inputs(self) -> tuple[list[int], list[int]]:
        """Fix ``U3``: ``(survivors, dropped)``; the unmask request every survivor receives."""
        if self.survivors is None:
            self._need(len(self.inputs), "masked inputs")
            self.survivors = sorted(self.inputs)
        assert self.sharers is not None
        return self.survivors, sorted(set(self.sharers) - set(self.survivors))

    def confirm(self, signer: int, signature: bytes) -> None:
        """Signed mode: survivor ``signer``'s signature over the unmask request (relayed, not verified here:
        the clients verify, against the run's CA, before they reveal anything)."""
        survivors, _ = self.close_inputs()
        if signer not in survivors:
            raise SecAggError(f"client {signer} confirmed the unmask request but is not a survivor")
        if not 0 < len(signature) <= MAX_SIGNATURE_BYTES:
            raise SecAggError(f"client {signer}'s confirmation has {len(signature)} bytes (1..{MAX_SIGNATURE_BYTES})")
        if self.confirmations.get(signer, signature) != signature:
            raise SecAggError(f"client {signer} confirmed the unmask request twice, differently")
        self.confirmations[signer] = signature
        self._count("confirm", len(signature))

    def confirmed(self, late: bool = False) -> bool:
        """Whether the confirmations can go out: every survivor's, or the threshold's once ``late``."""
        return self._from_survivors(set(self.confirmations), late)

    def _from_survivors(self, answers: set[int], late: bool) -> bool:
        """Whether ``answers`` from the survivors suffice: all of them, or the threshold once ``late`` (on a sparse
        graph, in each survivor's neighbourhood: :meth:`enough`)."""
        if self.survivors is None:
            return False
        if len(answers) == len(self.survivors):
            return True
        return late and len(answers) >= self.threshold and self._around(answers, self.survivors)

    def reveal(self, answerer: int, shares: dict[int, bytes]) -> None:
        """Survivor ``answerer``'s unmask answer: for each client of ``U2`` its share (of a survivor's seed,
        16 bytes; of a dropped client's mask key, 32), or for another client a complaint (:func:`is_complaint`)
        that its box did not open. Checked for form only; what the shares are worth, :meth:`result` checks."""
        survivors, dropped = self.close_inputs()
        if answerer not in survivors:
            raise SecAggError(f"client {answerer} answered the unmask request but is not a survivor")
        near = self.near(answerer)
        mine = None if near is None else set(near)
        want = {j: 16 for j in survivors if mine is None or j in mine}
        want |= {j: 32 for j in dropped if mine is None or j in mine}
        suffix = (SIGNED_SUFFIX_MIN, SIGNED_SUFFIX_MIN - 1 + MAX_SIGNATURE_BYTES) if self.signed else (0, 0)
        if sorted(shares) != sorted(want) or any(
            not (
                len(s) == want[j]
                if j == answerer
                else is_complaint(s) or want[j] + suffix[0] <= len(s) <= want[j] + suffix[1]
            )
            for j, s in shares.items()
        ):
            raise SecAggError(
                f"client {answerer}'s unmask answer does not hold one share (or a complaint about another's box) "
                "per client of the step"
            )
        if self.signed:  # each share one its owner dealt the answerer, under its signature
            assert self.roster is not None
            for j, s in sorted(shares.items()):
                if j != answerer and not is_complaint(s):
                    # The header and signature of the box relayed: its share is the one that header commits to (an
                    # honest answerer checked the signature; a proof checks it again). Only another one is checked here
                    box = self.boxes[j][answerer]
                    relayed = s[want[j] :] == box[:BOX_HEADER_BYTES] + box[BOX_BYTES:]
                    check = None if relayed else self.check
                    check_entry(check, self.roster[j].certificate, j, answerer, s, survivors, self.context)
        self.revealed[answerer] = dict(shares)
        self._count("unmask", sum(len(s) for s in shares.values()))

    def ready(self, late: bool = False) -> bool:
        """Whether the unmask answers suffice: every survivor's (a spare answer lets a wrong share be found
        and its sender named), or at least the threshold once ``late``."""
        return self._from_survivors(set(self.revealed), late)

    def result(self) -> np.ndarray:
        """The ring sum of the survivors' encoded inputs (masks removed).

        Each revealed share is checked against what its dealer committed to dealing the answerer
        (:func:`share_commitment`, in the box's header): a share that differs is the answerer's lie. Each
        secret is rebuilt from the shares that pass and checked: a survivor's seed against its commitment, a
        dropped client's mask key against its advertised public key; one that fails was dealt wrong by its
        owner. A complaint leaves that pair's share out; :meth:`complaint_verdicts` says whose box was wrong.
        :class:`Culprits` when a check fails and the protocol can tell who lied, else ``SecAggError``."""
        survivors, dropped = self.close_inputs()
        self._need(len(self.revealed), "unmask answers")
        assert self.roster is not None and self.sharers is not None
        roster = self.roster
        blamed, _ = self.complaint_verdicts()
        proofs: dict[int, dict] = {}
        liars = {} if self.signed else self._wrong_shares(survivors)  # signed: each share checked on arrival
        if liars:
            raise Culprits(blamed | liars)
        seeds: dict[int, bytes] = {}
        keys: dict[int, bytes] = {}
        needed = [j for j in dropped if any(self._adjacent(i, j) for i in survivors)]  # whose masks remain
        for j in survivors + needed:
            positions = self.holders(j)  # the x-coordinates j's shares were made for
            answers = {a: s[j] for a, s in self.revealed.items() if j in s and not is_complaint(s[j])}
            if j in survivors:
                pieces = {a: [s] for a, s in answers.items()}
                check = functools.partial(seed_matches, roster[j].commitment, j, self.context)
                what = "own-mask seed"
            else:
                pieces = {a: [s[:16], s[16:]] for a, s in answers.items()}
                check = functools.partial(key_matches, roster[j].mask_public)
                what = "mask key"
            try:
                if self.signed:
                    secret = self._rebuild_signed(j, answers, survivors, check, what, positions)
                else:
                    secret = rebuild(pieces, positions, self.threshold, check, j, what)
            except Culprits as err:
                blamed |= err.why
                proofs |= err.proofs
                continue
            except SecAggError:
                if blamed:  # too few shares left, and the complaints named whose boxes were wrong
                    raise Culprits(blamed, proofs) from None
                raise
            (seeds if j in survivors else keys)[j] = secret
        if blamed and (len(seeds) < len(survivors) or len(keys) < len(needed)):
            raise Culprits(blamed, proofs)
        publics = {j: roster[j].mask_public for j in self.sharers}
        adjacent = None if self.graph is None else self.graph.adjacent
        return unmask(self.total, survivors, keys, seeds, publics, self.context, adjacent)
