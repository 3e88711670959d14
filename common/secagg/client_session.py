"""Secure aggregation, the client's side of one step: :class:`ClientSession` (fresh keys and seed).

One method a round: advertise, share, mask, and in the signed mode confirm, then reveal. What it checks of
what the coordinator relays (the roster's keys, the unmask request) is the protocol's of ``rounds.py``; it
seals and opens its boxes with ``boxes.py`` and, signed, signs and checks them with ``blame.py``. The
client's transport drives it over the wire (``client/secure.py``); the coordinator's side is
``server_session.py``.
"""

from __future__ import annotations

import os

import numpy as np

from common.secagg.blame import check_dealt, sign_box, split_signed
from common.secagg.boxes import box_key, open_with, seal
from common.secagg.graph import Graph
from common.secagg.primitives import SecAggError, keypair, masked, share
from common.secagg.rounds import (
    BOX_BYTES,
    COMPLAINT,
    PIECE_BYTES,
    SEED_BYTES,
    Keys,
    check_distinct,
    key_fingerprints,
    seed_commitment,
    verify_roster,
)
from common.secagg.signed_messages import keys_message, survivors_message
from common.secagg.signing import Signer, Verifier


def _check_partition(survivors: list[int], dropped: list[int], sharers: list[int], threshold: int) -> None:
    if set(survivors) & set(dropped) or sorted(set(survivors) | set(dropped)) != sorted(sharers):
        raise SecAggError(
            f"unmask request: survivors {sorted(survivors)} and dropped {sorted(dropped)} are not a partition of "
            f"the clients that shared keys {sorted(sharers)}"
        )
    if len(survivors) < threshold:
        raise SecAggError(f"unmask request: {len(survivors)} survivors, fewer than the threshold {threshold}")


class ClientSession:
    """Client ``index``'s side of one step's secure aggregation (fresh keys and seed).

    Signed (``signer`` and ``verifier`` given: the malicious-coordinator mode): the advertised keys carry
    the client's certificate and its signature over them (:func:`keys_message`), every roster entry is
    verified against the run's CA before anything is shared, and before revealing any share the client
    needs ``threshold`` signatures of survivors over the same unmask request (:meth:`confirm`).

    ``graph`` (``common/secagg/graph.py``; ``None``: complete): the client shares with, masks against and answers
    for its closed neighbourhood only, which it computes itself; a roster naming any other client is refused, and
    ``threshold`` is the neighbourhood's (the consistency round's signatures too come from its neighbours)."""

    def __init__(
        self,
        index: int,
        threshold: int,
        context: bytes,
        signer: Signer | None = None,
        verifier: Verifier | None = None,
        graph: Graph | None = None,
    ) -> None:
        if (signer is None) != (verifier is None):
            raise SecAggError("a signed session needs both the client's signer and the run's CA")
        self.index, self.threshold, self.context = index, threshold, context
        self.signer, self.verifier = signer, verifier
        self.neighbourhood = None if graph is None or graph.complete else set(graph.closed(index))
        self.cipher_private, cipher_public = keypair()
        self.mask_private, mask_public = keypair()
        self.seed = os.urandom(SEED_BYTES)
        commitment = seed_commitment(self.seed, index, context)
        self.keys = Keys(index, cipher_public, mask_public, commitment)
        if signer is not None:
            message = keys_message(context, index, signer.identity, cipher_public, mask_public, commitment)
            self.keys = Keys(index, cipher_public, mask_public, commitment, signer.certificate, signer.sign(message))
        self.identities: dict[int, str] = {}  # signed: each roster client's verified identity
        self.request: tuple[list[int], list[int]] | None = None  # signed: the unmask request this client signed
        self.roster: dict[int, Keys] = {}
        self.sharers: list[int] = []  # the clients of this client's neighbourhood that shared (U2 there)
        self.all_sharers: list[int] = []  # U2, as the coordinator names it
        self.own = b""  # this client's own shares of its secrets (set by share)
        self.answered = False
        self.complaints: list[int] = []  # the senders whose boxes did not open (set by reveal)

    def advertise(self) -> Keys:
        return self.keys

    def share(self, roster: dict[int, Keys]) -> dict[int, bytes]:
        """Sealed shares of the seed and mask key for every other client of ``roster`` (``U1``)."""
        if roster.get(self.index) != self.keys:
            raise SecAggError(f"the roster does not hold client {self.index}'s advertised keys")
        if len(roster) < self.threshold:
            raise SecAggError(f"a roster of {len(roster)} clients, fewer than the threshold {self.threshold}")
        if self.neighbourhood is not None and not set(roster) <= self.neighbourhood:
            # Shares dealt to a client that is no neighbour: the coordinator deviated (every party draws the same graph)
            outside = sorted(set(roster) - self.neighbourhood)[:10]
            raise SecAggError(f"the roster names clients {outside}, which are not client {self.index}'s neighbours")
        prints = {}
        for i, k in roster.items():
            if k.index != i:
                raise SecAggError(f"the roster lists client {k.index}'s keys under index {i}")
            # Sizes, canonical points of no low order: the coordinator refuses any other advertise, so an entry
            # failing here means it deviated; this client sits the session out rather than raise in an exchange.
            prints[i] = key_fingerprints(k)
        check_distinct(roster, prints)
        if self.verifier is not None:
            self.identities = verify_roster(self.verifier, roster, self.context)
        self.roster = dict(roster)
        clients = sorted(roster)
        seeds, keys = share(self.seed, self.threshold, clients), share(self.mask_private, self.threshold, clients)
        pieces = {j: seeds[j][0] + b"".join(keys[j]) for j in clients}  # 16 bytes of seed share, 32 of key share
        self.own = pieces[self.index]  # its own shares: kept, never sent
        boxes = {
            j: seal(self.cipher_private, roster[j].cipher_public, self.index, j, pieces[j], self.context)
            for j in clients
            if j != self.index
        }
        if self.signer is None:
            return boxes
        position = {j: k + 1 for k, j in enumerate(clients)}  # the x-coordinates share() dealt at
        return {j: sign_box(self.signer, b, self.index, j, position[j], self.context) for j, b in boxes.items()}

    def mask(self, values: np.ndarray, sharers: list[int]) -> np.ndarray:
        """``y_i``: the encoded ``values`` masked, pairwise with ``sharers`` (``U2``; on a sparse graph, those
        of this client's neighbourhood)."""
        mine = sorted(j for j in sharers if self.neighbourhood is None or j in self.neighbourhood)
        if self.index not in mine or not set(mine) <= set(self.roster) or len(mine) < self.threshold:
            raise SecAggError(
                f"masking: the clients that shared ({mine[:20]}) must include client {self.index}, lie in "
                f"the roster and number at least {self.threshold}"
            )
        self.sharers, self.all_sharers = mine, sorted(sharers)
        publics = {j: self.roster[j].mask_public for j in self.sharers}
        return masked(values, self.index, self.mask_private, publics, self.seed, self.context)

    def _check_request(self, survivors: list[int], dropped: list[int]) -> None:
        """``SecAggError`` unless the unmask request partitions ``U2``, names at least ``t`` survivors (no
        request could reveal both secrets of one client) and counts this client among them. On a sparse graph
        the threshold is of the survivors among this client's neighbourhood."""
        _check_partition(survivors, dropped, self.all_sharers or self.sharers, 1)
        near = [j for j in survivors if j in self.sharers]
        if len(near) < self.threshold:
            where = "" if self.neighbourhood is None else f" in client {self.index}'s neighbourhood"
            raise SecAggError(
                f"unmask request: {len(near)} survivors{where}, fewer than the threshold {self.threshold}"
            )
        if self.index not in survivors:
            raise SecAggError(f"unmask request names client {self.index} among the dropped")

    def confirm(self, survivors: list[int], dropped: list[int]) -> bytes:
        """Signed mode, the consistency round: this client's signature over the unmask request, which it
        then answers alone (a coordinator that sends another request later gets nothing)."""
        assert self.signer is not None, "confirm is the signed mode's round"
        self._check_request(survivors, dropped)
        if self.request is not None and self.request != (survivors, dropped):
            raise SecAggError(f"client {self.index} signed another unmask request of this step already")
        self.request = (list(survivors), list(dropped))
        return self.signer.sign(survivors_message(self.context, survivors, dropped))

    def check_confirmations(self, survivors: list[int], dropped: list[int], signatures: dict[int, bytes]) -> None:
        """``SecAggError`` unless at least ``threshold`` survivors of the roster signed this very request."""
        assert self.verifier is not None
        if self.request != (survivors, dropped):
            raise SecAggError(f"client {self.index} is asked to reveal for a request it did not sign")
        message = survivors_message(self.context, survivors, dropped)
        good = set()
        for j, signature in signatures.items():
            if j not in survivors or j not in self.roster:
                continue
            if self.verifier.verify(self.roster[j].certificate, message, signature) != self.identities[j]:
                raise SecAggError(f"client {j}'s confirmation is signed by another identity than its keys")
            good.add(j)
        if len(good) < self.threshold:
            raise SecAggError(
                f"only {len(good)} survivors signed the unmask request, fewer than the threshold {self.threshold}: "
                "the coordinator may be showing different requests to different clients; nothing is revealed"
            )

    def reveal(
        self,
        inbox: dict[int, bytes],
        survivors: list[int],
        dropped: list[int],
        confirmations: dict[int, bytes] | None = None,
    ) -> dict[int, bytes]:
        """The shares the coordinator may have: of each survivor's seed and each dropped client's mask key.

        ``inbox``: the sealed shares the other clients of ``U2`` sent this client. Answers once per step.
        Signed: ``confirmations`` (signer -> signature over the request) must hold the threshold's.

        A box of the protocol's size that does not open (not sealed under the pair's key, changed, or holding
        other shares than its header commits to) is its sender's fault or the coordinator's, not a reason to
        stop: that sender's share is left out (as if the pair had dropped: the other answers rebuild its
        secret) and the entry carries a complaint instead (:data:`COMPLAINT`; ``self.complaints`` names the
        senders). In the honest mode the complaint reveals the pair's box key, which opens this pair's two
        boxes and nothing else, so that the coordinator can tell whose box is wrong
        (:meth:`ServerSession.complaint_verdicts`); in the signed mode it reveals no key, since a coordinator that
        deviates could spoil boxes on purpose to collect this client's shares. A box of another size, or one
        missing, the coordinator should have refused: ``SecAggError`` (this client sits the session out). In the
        signed mode a box without its dealer's signature over its header and this client's x-coordinate is a
        complaint too (the coordinator does not check the n^2 signatures: each recipient checks its own). Signed,
        each share of another client's secret goes out with that header, the x-coordinate and the dealer's
        signature (:func:`check_entry`), so that the answer proves what it holds was dealt."""
        if self.answered:
            raise SecAggError(f"client {self.index} has answered this step's unmask request already")
        self._check_request(survivors, dropped)
        if self.verifier is not None:
            self.check_confirmations(survivors, dropped, confirmations or {})
        plain = {self.index: self.own}
        complaints: dict[int, bytes] = {}
        signed: dict[int, bytes] = {}  # signed mode: per sender, the header, x-coordinate and signature of its box
        for j in self.sharers:
            if j == self.index:
                continue
            if j not in inbox:
                raise SecAggError(f"client {self.index} holds no shares from client {j}")
            box = inbox[j]
            if self.verifier is not None:
                box, header, position, sig = split_signed(box, BOX_BYTES)
                cert = self.roster[j].certificate
                try:
                    check_dealt(self.verifier.verify, cert, j, self.index, header, position, sig, self.context)
                except SecAggError:  # not as its dealer signed it: the dealer's doing, or the coordinator's
                    complaints[j] = COMPLAINT
                    continue
                signed[j] = header + inbox[j][BOX_BYTES:]  # the position and signature follow the box
            root = box_key(self.cipher_private, self.roster[j].cipher_public, self.context)
            opened = open_with(root, j, self.index, box, self.context)
            if (len(opened) != PIECE_BYTES) if opened is not None else (len(box) != BOX_BYTES):
                size = f"hold {len(opened)} bytes, not {PIECE_BYTES}" if opened is not None else f"are {len(box)} bytes"
                raise SecAggError(
                    f"client {j}'s sealed shares for client {self.index} {size}: the coordinator relays boxes of "
                    f"{BOX_BYTES} bytes only"
                )
            if opened is None:
                complaints[j] = COMPLAINT + (root if self.verifier is None else b"")
            else:
                plain[j] = opened
        self.answered = True
        self.complaints = sorted(complaints)
        answer = {j: plain[j][:SEED_BYTES] for j in survivors if j in plain}
        answer |= {j: plain[j][SEED_BYTES:] for j in dropped if j in plain}
        return {j: a + signed.get(j, b"") for j, a in answer.items()} | complaints
