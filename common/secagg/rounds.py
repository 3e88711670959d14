"""Secure aggregation's rounds: one client's side and the coordinator's side of one step.

SecAgg (Bonawitz et al., CCS 2017) against an honest-but-curious coordinator, on the primitives of
``common/secagg/primitives.py``. For the clients ``U0`` a step expects:

0. **advertise**: client ``i`` sends two fresh X25519 public keys, ``c_i`` (its shares travel
   encrypted under it) and ``s_i`` (its pairwise masks). The coordinator fixes the roster ``U1``
   of those it heard from (at least ``t``).
1. **share**: client ``i`` draws its own-mask seed ``b_i`` and Shamir-shares ``b_i`` and the private
   key of ``s_i`` among ``U1`` (threshold ``t``); the shares for ``j`` are sealed with ChaCha20-Poly1305
   under ``HKDF(DH(c_i, c_j))`` and relayed by the coordinator, which cannot read them. ``U2``: the
   clients that shared.
2. **masked input**: client ``i`` in ``U2`` sends ``y_i = x_i + PRG(b_i) + sum_{j>i} s_ij - sum_{j<i} s_ij``
   (pairwise with ``U2``); the coordinator adds the ``y_i`` up as they arrive (one vector in memory,
   however many clients). ``U3``: the clients whose input arrived.
3. **unmask**: the coordinator names the survivors ``U3`` and the dropped ``U2 - U3``. Each survivor
   answers with its shares of ``b_j`` for each survivor ``j`` and of ``s_j``'s private key for each
   dropped ``j``; from ``t`` answers the coordinator rebuilds them and removes every mask: the sum
   of the survivors' ``x_i`` and nothing else.

A client refuses an unmask request that names fewer than ``t`` survivors, that is not a partition of
``U2``, or that would reveal both secrets of one client. Keys, seeds and masks are fresh for every
step and bound to the step's ``context``. Each client commits to its seed when it advertises, so that a
rebuilt seed is checked (and, with spare answers, the sender of a wrong share is named: :func:`rebuild`).

The signed mode (Bonawitz et al. 2017, section 6, against a coordinator that deviates) adds: each
client signs its advertised keys with its mTLS key and checks every roster entry against the run's CA
(:func:`verify_roster`: no substituted, moved or doubled keys), and a consistency round between the
unmask request and the answers: each survivor signs the request it was shown, and reveals nothing
unless ``t`` survivors signed the same one (a coordinator splitting its requests between two groups
then needs ``2t - n`` colluding clients; the mode asks ``t > 2n / 3``). Not covered: clients that
collude with the coordinator beyond ``t - 1``, and a CA held by the coordinator (docs/RELIABILITY.md).
"""

from __future__ import annotations

import functools
import hashlib
import itertools
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.primitives import SecAggError, combine, keypair, masked, ring_add, ring_zeros, share, unmask
from common.secagg.signing import Signer, Verifier, keys_message, survivors_message


def default_threshold(clients: int, signed: bool = False) -> int:
    """``floor(n / 2) + 1``: a majority must finish (and no minority can unmask an individual). Signed
    (against a coordinator that deviates): ``floor(2n / 3) + 1``, so that a coordinator splitting its unmask
    requests between two groups still needs ``2t - n > n / 3`` colluding clients."""
    return 2 * clients // 3 + 1 if signed else clients // 2 + 1


KEY_BYTES = 32  # an X25519 public key
COMMITMENT_BYTES = 32  # SHA-256
SEED_BYTES = 16  # a client's own-mask seed (one Shamir block)
PIECE_BYTES = SEED_BYTES + 2 * 16  # one recipient's shares: of the seed, and of the 32-byte mask key (two blocks)
BOX_BYTES = PIECE_BYTES + 16  # sealed: ChaCha20-Poly1305 adds its 16-byte tag
MAX_SIGNATURE_BYTES = 512


@dataclass(frozen=True)
class Keys:
    """What a client advertises: its share-encryption and mask-agreement public keys (32 bytes each)
    and its commitment to its own-mask seed (:func:`seed_commitment`), by which a rebuilt seed is checked.
    In the malicious-coordinator mode also its certificate and its signature over all of it."""

    index: int
    cipher_public: bytes
    mask_public: bytes
    commitment: bytes = b""
    certificate: bytes = b""
    signature: bytes = b""


class Culprits(SecAggError):
    """A failure the protocol can pin on particular clients (``culprits``: their indices, ``why``: per client)."""

    def __init__(self, why: dict[int, str]) -> None:
        self.why = dict(sorted(why.items()))
        super().__init__("; ".join(f"client {i}: {w}" for i, w in self.why.items()))


def seed_commitment(seed: bytes, index: int, context: bytes) -> bytes:
    """SHA-256 over the step's ``context``, the client's index and its own-mask ``seed``: published in the
    advertise round, it lets the coordinator check a seed rebuilt from shares (a wrong share is caught,
    not unmasked into a wrong sum). Hiding: the seed is 128 random bits, never reused."""
    return hashlib.sha256(b"lorm-secagg-seed|" + struct.pack(">I", index) + context + b"|" + seed).digest()


def check_keys_form(keys: Keys) -> None:
    """``SecAggError`` unless ``keys`` has the sizes the protocol uses (checked before anything is stored)."""
    if len(keys.cipher_public) != KEY_BYTES or len(keys.mask_public) != KEY_BYTES:
        raise SecAggError(
            f"client {keys.index} advertised keys of {len(keys.cipher_public)} and "
            f"{len(keys.mask_public)} bytes; X25519 public keys have {KEY_BYTES}"
        )
    if len(keys.commitment) != COMMITMENT_BYTES:
        raise SecAggError(
            f"client {keys.index}'s seed commitment has {len(keys.commitment)} bytes, not {COMMITMENT_BYTES}"
        )


def check_distinct(roster: dict[int, Keys]) -> None:
    """``SecAggError`` if two clients of ``roster`` share a public key: a copied key would let its owner's
    masks or shares be computed by the copier (or mark a coordinator relaying one client twice)."""
    seen: dict[bytes, int] = {}
    for i, k in sorted(roster.items()):
        for key in (k.cipher_public, k.mask_public):
            if key in seen:
                raise SecAggError(f"clients {seen[key]} and {i} advertised the same public key")
            seen[key] = i


def verify_roster(verifier: Verifier, roster: dict[int, Keys], context: bytes) -> dict[int, str]:
    """Signed mode: each roster entry's certificate is the run CA's and its signature covers this step,
    its index and its keys; no identity holds two slots. Returns each index's identity; ``SecAggError``
    naming the first entry that fails (a coordinator that substituted or moved keys)."""
    identities: dict[int, str] = {}
    for i, k in sorted(roster.items()):
        if not k.certificate or not k.signature:
            raise SecAggError(f"client {i}'s keys carry no certificate and signature: the run is signed")
        who = verifier.identity(k.certificate)
        message = keys_message(context, i, who, k.cipher_public, k.mask_public, k.commitment)
        verifier.verify(k.certificate, message, k.signature)
        if who in identities.values():
            raise SecAggError(f"identity {who!r} holds two slots of the roster")
        identities[i] = who
    return identities


def _box_key(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    secret = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-box|" + context).derive(secret)


def _aad(context: bytes, sender: int, recipient: int) -> bytes:
    return context + struct.pack(">II", sender, recipient)


def seal(private: bytes, peer_public: bytes, sender: int, recipient: int, plaintext: bytes, context: bytes) -> bytes:
    """``plaintext`` for ``recipient`` only: ChaCha20-Poly1305 under the pair's key; the nonce is the
    sender's index (each pair's key is used once per direction and step)."""
    nonce = struct.pack(">I", sender).rjust(12, b"\x00")
    key = _box_key(private, peer_public, context)
    return ChaCha20Poly1305(key).encrypt(nonce, plaintext, _aad(context, sender, recipient))


def open_box(private: bytes, peer_public: bytes, sender: int, recipient: int, box: bytes, context: bytes) -> bytes:
    """The plaintext of :func:`seal`; ``SecAggError`` if it was changed, or is not from ``sender`` to ``recipient``."""
    nonce = struct.pack(">I", sender).rjust(12, b"\x00")
    try:
        return ChaCha20Poly1305(_box_key(private, peer_public, context)).decrypt(
            nonce, box, _aad(context, sender, recipient)
        )
    except InvalidTag:
        raise SecAggError(f"the shares client {sender} sent to client {recipient} do not authenticate") from None


def public_of(private: bytes) -> bytes:
    raw = serialization.Encoding.Raw
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(raw, serialization.PublicFormat.Raw)


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
    needs ``threshold`` signatures of survivors over the same unmask request (:meth:`confirm`)."""

    def __init__(
        self, index: int, threshold: int, context: bytes, signer: Signer | None = None, verifier: Verifier | None = None
    ) -> None:
        if (signer is None) != (verifier is None):
            raise SecAggError("a signed session needs both the client's signer and the run's CA")
        self.index, self.threshold, self.context = index, threshold, context
        self.signer, self.verifier = signer, verifier
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
        self.sharers: list[int] = []
        self.own = b""  # this client's own shares of its secrets (set by share)
        self.answered = False

    def advertise(self) -> Keys:
        return self.keys

    def share(self, roster: dict[int, Keys]) -> dict[int, bytes]:
        """Sealed shares of the seed and mask key for every other client of ``roster`` (``U1``)."""
        if roster.get(self.index) != self.keys:
            raise SecAggError(f"the roster does not hold client {self.index}'s advertised keys")
        if len(roster) < self.threshold:
            raise SecAggError(f"a roster of {len(roster)} clients, fewer than the threshold {self.threshold}")
        for i, k in roster.items():
            if k.index != i:
                raise SecAggError(f"the roster lists client {k.index}'s keys under index {i}")
            check_keys_form(k)
        check_distinct(roster)
        if self.verifier is not None:
            self.identities = verify_roster(self.verifier, roster, self.context)
        self.roster = dict(roster)
        clients = sorted(roster)
        seeds, keys = share(self.seed, self.threshold, clients), share(self.mask_private, self.threshold, clients)
        pieces = {j: seeds[j][0] + b"".join(keys[j]) for j in clients}  # 16 bytes of seed share, 32 of key share
        self.own = pieces[self.index]  # its own shares: kept, never sent
        return {
            j: seal(self.cipher_private, roster[j].cipher_public, self.index, j, pieces[j], self.context)
            for j in clients
            if j != self.index
        }

    def mask(self, values: np.ndarray, sharers: list[int]) -> np.ndarray:
        """``y_i``: the encoded ``values`` masked, pairwise with ``sharers`` (``U2``)."""
        if self.index not in sharers or not set(sharers) <= set(self.roster) or len(sharers) < self.threshold:
            raise SecAggError(
                f"masking: the clients that shared ({sorted(sharers)}) must include client {self.index}, lie in "
                f"the roster and number at least {self.threshold}"
            )
        self.sharers = sorted(sharers)
        publics = {j: self.roster[j].mask_public for j in self.sharers}
        return masked(values, self.index, self.mask_private, publics, self.seed, self.context)

    def _check_request(self, survivors: list[int], dropped: list[int]) -> None:
        """``SecAggError`` unless the unmask request partitions ``U2``, names at least ``t`` survivors (no
        request could reveal both secrets of one client) and counts this client among them."""
        _check_partition(survivors, dropped, self.sharers, self.threshold)
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
        Signed: ``confirmations`` (signer -> signature over the request) must hold the threshold's."""
        if self.answered:
            raise SecAggError(f"client {self.index} has answered this step's unmask request already")
        self._check_request(survivors, dropped)
        if self.verifier is not None:
            self.check_confirmations(survivors, dropped, confirmations or {})
        plain = {self.index: self.own}
        for j in self.sharers:
            if j == self.index:
                continue
            if j not in inbox:
                raise SecAggError(f"client {self.index} holds no shares from client {j}")
            peer = self.roster[j].cipher_public
            plain[j] = open_box(self.cipher_private, peer, j, self.index, inbox[j], self.context)
            if len(plain[j]) != PIECE_BYTES:
                raise SecAggError(
                    f"client {j}'s sealed shares for client {self.index} hold {len(plain[j])} bytes, not {PIECE_BYTES}"
                )
        self.answered = True
        return {j: plain[j][:SEED_BYTES] for j in survivors} | {j: plain[j][SEED_BYTES:] for j in dropped}


@dataclass
class ServerSession:
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
    total: np.ndarray = field(init=False)
    inputs: list[int] = field(default_factory=list)  # U3 so far
    survivors: list[int] | None = None
    revealed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # answerer -> owner -> share
    confirmations: dict[int, bytes] = field(default_factory=dict)  # signed mode: survivor -> its signed request
    received: dict[str, int] = field(default_factory=dict)  # round -> bytes the clients sent in it

    def __post_init__(self) -> None:
        if not 1 <= self.threshold <= len(self.expected):
            raise SecAggError(f"threshold {self.threshold} for {len(self.expected)} clients")
        self.total = ring_zeros(self.size)

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
        check_keys_form(keys)
        if keys.index in self.keys:
            if self.keys[keys.index] != keys:
                raise SecAggError(f"client {keys.index} advertised different keys twice")
            return
        check_distinct({**self.keys, keys.index: keys})
        self.keys[keys.index] = keys
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
        if sorted(boxes) != sorted(j for j in self.roster if j != sender):
            raise SecAggError(f"client {sender} must send shares to each other client of the roster, once")
        sizes = {len(b) for b in boxes.values()}
        if sizes - {BOX_BYTES}:
            raise SecAggError(
                f"client {sender}'s sealed shares must be {BOX_BYTES} bytes each, got sizes {sorted(sizes)}"
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
        """The sealed shares ``U2``'s clients sent ``recipient``."""
        assert self.sharers is not None
        return {i: self.boxes[i][recipient] for i in self.sharers if i != recipient}

    def masked_input(self, sender: int, y: np.ndarray) -> None:
        if self.sharers is None or sender not in self.sharers or self.survivors is not None:
            raise SecAggError(f"client {sender}'s masked input arrived outside the input round or it did not share")
        if sender in self.inputs:
            return  # a retry of an input already added (idempotent)
        y = np.asarray(y, dtype=np.uint64)
        if not self.size and y.ndim == 2:
            self.size, self.total = len(y), ring_zeros(len(y))
        if y.shape != (self.size, 2):
            raise SecAggError(f"client {sender}'s masked input has shape {y.shape}, the step's sums ({self.size}, 2)")
        self.total = ring_add(self.total, y)
        self.inputs.append(sender)
        self._count("masked", y.nbytes)

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
        return self._from_survivors(len(self.confirmations), late)

    def _from_survivors(self, answers: int, late: bool) -> bool:
        """Whether ``answers`` from the survivors suffice: all of them, or the threshold once ``late``."""
        if self.survivors is None:
            return False
        return answers == len(self.survivors) or (late and answers >= self.threshold)

    def reveal(self, answerer: int, shares: dict[int, bytes]) -> None:
        survivors, dropped = self.close_inputs()
        if answerer not in survivors:
            raise SecAggError(f"client {answerer} answered the unmask request but is not a survivor")
        want = {j: 16 for j in survivors} | {j: 32 for j in dropped}
        if {j: len(s) for j, s in shares.items()} != want:
            raise SecAggError(f"client {answerer}'s unmask answer does not hold one share per client of the step")
        self.revealed[answerer] = dict(shares)
        self._count("unmask", sum(len(s) for s in shares.values()))

    def ready(self, late: bool = False) -> bool:
        """Whether the unmask answers suffice: every survivor's (a spare answer lets a wrong share be found
        and its sender named), or at least the threshold once ``late``."""
        return self._from_survivors(len(self.revealed), late)

    def result(self) -> np.ndarray:
        """The ring sum of the survivors' encoded inputs (masks removed).

        Each secret is rebuilt from the answers and checked: a survivor's seed against its commitment, a
        dropped client's mask key against its advertised public key. :class:`Culprits` when a check fails
        and the protocol can tell who lied (:func:`rebuild`), else ``SecAggError``."""
        survivors, dropped = self.close_inputs()
        self._need(len(self.revealed), "unmask answers")
        assert self.roster is not None and self.sharers is not None
        roster = self.roster
        positions = sorted(roster)  # the x-coordinates each client's shares were made for
        seeds: dict[int, bytes] = {}
        keys: dict[int, bytes] = {}
        blamed: dict[int, str] = {}
        for j in survivors + dropped:
            if j in survivors:
                pieces = {a: [s[j]] for a, s in self.revealed.items()}
                check = functools.partial(_seed_matches, roster[j].commitment, j, self.context)
                what = "own-mask seed"
            else:
                pieces = {a: [s[j][:16], s[j][16:]] for a, s in self.revealed.items()}
                check = functools.partial(_key_matches, roster[j].mask_public)
                what = "mask key"
            try:
                secret = rebuild(pieces, positions, self.threshold, check, j, what)
            except Culprits as err:
                blamed |= err.why
                continue
            (seeds if j in survivors else keys)[j] = secret
        if blamed:
            raise Culprits(blamed)
        publics = {j: roster[j].mask_public for j in self.sharers}
        return unmask(self.total, survivors, keys, seeds, publics, self.context)


def _seed_matches(commitment: bytes, index: int, context: bytes, seed: bytes) -> bool:
    return seed_commitment(seed, index, context) == commitment


def _key_matches(public: bytes, private: bytes) -> bool:
    return public_of(private) == public


SEARCH_LIMIT = 256  # subsets of answers tried to find a wrong share's sender (leave-one-out, then leave-two-out)


def rebuild(
    pieces: dict[int, list[bytes]],
    positions: list[int],
    threshold: int,
    check: Callable[[bytes], bool],
    owner: int,
    what: str,
) -> bytes:
    """The secret of client ``owner`` from the answers ``pieces`` (answerer -> its shares), checked by ``check``.

    The first and the last ``threshold`` answers are both checked (one more combine with spare answers):
    together they cover every answerer, so a wrong share is caught whatever its sender's index; the first
    alone would pass over a liar ranked past the threshold. With a wrong share among the answers, a
    ``threshold``-subset that passes the check is searched for (leaving out one answerer, then two; at
    most :data:`SEARCH_LIMIT` subsets); the answerers whose shares
    do not lie on that subset's polynomial lied: :class:`Culprits` names them. If every answer lies on one
    polynomial (each later answer swapped into the first ``threshold`` gives the same secret) whose secret
    fails the check, ``owner`` dealt shares of another secret than it committed
    to: :class:`Culprits` names ``owner``. Otherwise ``SecAggError`` (too few spare answers to tell)."""
    answerers = sorted(pieces)
    first = combine({a: pieces[a] for a in answerers[:threshold]}, positions, threshold)
    last = answerers[-threshold:]
    if check(first) and (
        last == answerers[:threshold] or check(combine({a: pieces[a] for a in last}, positions, threshold))
    ):
        return first
    spare = len(answerers) - threshold
    tried = 0
    for left_out in (1, 2):
        if left_out > spare:
            break
        for out in itertools.combinations(answerers, left_out):
            tried += 1
            if tried > SEARCH_LIMIT:
                break
            kept = [a for a in answerers if a not in out][:threshold]
            secret = combine({a: pieces[a] for a in kept}, positions, threshold)
            if check(secret):
                liars = [a for a in answerers if a not in kept and not check(_swapped(pieces, kept, a, positions))]
                if liars:
                    raise Culprits({a: f"revealed a wrong share of client {owner}'s {what}" for a in liars})
                return secret
    base = answerers[:threshold]
    if spare >= 1 and all(_swapped(pieces, base, a, positions) == first for a in answerers[threshold:]):
        raise Culprits({owner: f"dealt shares of its {what} that rebuild to another value than it committed to"})
    raise SecAggError(
        f"the shares of client {owner}'s {what} do not rebuild to what it committed to, and {len(answerers)} answers "
        f"(threshold {threshold}) do not tell whose share is wrong"
    )


def _swapped(pieces: dict[int, list[bytes]], base: list[int], a: int, positions: list[int]) -> bytes:
    """The secret of ``base``'s answers with answerer ``a``'s in place of the last: ``a``'s share lies on the
    polynomial of ``base`` exactly when this is ``base``'s own secret."""
    chosen = base[:-1] + [a]
    return combine({b: pieces[b] for b in chosen}, positions, len(chosen))


def session_state(session: ServerSession) -> dict:
    """What the coordinator persists of a step's session (JSON; bytes as hex): everything but the
    masked total, which it rebuilds from the staged masked inputs of the survivors."""
    return {
        "expected": session.expected,
        "threshold": session.threshold,
        "context": session.context.hex(),
        "keys": {
            str(i): [
                k.cipher_public.hex(),
                k.mask_public.hex(),
                k.commitment.hex(),
                k.certificate.hex(),
                k.signature.hex(),
            ]
            for i, k in session.keys.items()
        },
        "roster": None if session.roster is None else sorted(session.roster),
        "boxes": {str(i): {str(j): b.hex() for j, b in boxes.items()} for i, boxes in session.boxes.items()},
        "sharers": session.sharers,
        "survivors": session.survivors,  # U3 once fixed; the inputs are then added again on resume
        "revealed": {str(i): {str(j): s.hex() for j, s in shares.items()} for i, shares in session.revealed.items()},
        "confirmations": {str(i): sig.hex() for i, sig in session.confirmations.items()},
        "received": session.received,
    }


def session_from_state(state: dict) -> ServerSession:
    """Inverse of :func:`session_state`, before the inputs are added again (``inputs`` empty)."""
    keys = {int(i): Keys(int(i), *(bytes.fromhex(v) for v in fields)) for i, fields in state["keys"].items()}
    return ServerSession(
        expected=list(state["expected"]),
        threshold=int(state["threshold"]),
        context=bytes.fromhex(state["context"]),
        keys=keys,
        roster=None if state["roster"] is None else {i: keys[i] for i in state["roster"]},
        boxes={int(i): {int(j): bytes.fromhex(b) for j, b in bx.items()} for i, bx in state["boxes"].items()},
        sharers=state["sharers"],
        revealed={int(i): {int(j): bytes.fromhex(s) for j, s in sh.items()} for i, sh in state["revealed"].items()},
        confirmations={int(i): bytes.fromhex(sig) for i, sig in state.get("confirmations", {}).items()},
        received=dict(state["received"]),
    )
