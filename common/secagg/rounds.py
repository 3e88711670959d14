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
rebuilt seed is checked.

Against hostile clients (each check names the attack it stops):

- **Keys** (:func:`key_fingerprints`): a public key must be a canonical encoding of a point of no low
  order, or every honest client's exchange with it fails (or is public); keys are compared by their
  exchange with a fixed key, so that another encoding of a copied key is a copy. The coordinator refuses
  such an advertise, and each client refuses a roster holding one (the coordinator deviated).
- **Boxes** (:func:`seal_with`): each box carries, in the clear, its dealer's commitments to the two
  shares in it (:func:`share_commitment`) and to the pair's box key. The recipient checks what it opens
  against them, the coordinator each revealed share: an answerer that reveals another share than it was
  dealt is named, and shares that do not rebuild the committed secret are their dealer's fault
  (:func:`rebuild`), never an honest recipient's.
- **Complaints** (:meth:`ClientSession.reveal`, :meth:`ServerSession.complaint_verdicts`): a box that does not
  open is left out of the recipient's answer (a dropout of that pair: the other shares rebuild the secret)
  and the recipient complains, revealing that pair's box key (honest mode), by which the coordinator judges
  whose box is wrong from the two boxes it relayed.

The signed mode (Bonawitz et al. 2017, section 6, against a coordinator that deviates) adds: each
client signs its advertised keys with its mTLS key and checks every roster entry against the run's CA
(:func:`verify_roster`: no substituted, moved or doubled keys), and a consistency round between the
unmask request and the answers: each survivor signs the request it was shown, and reveals nothing
unless ``t`` survivors signed the same one (a coordinator splitting its requests between two groups
then needs ``2t - n`` colluding clients; the mode asks ``t > 2n / 3``). Not covered: clients that
collude with the coordinator beyond ``t - 1``, and a CA held by the coordinator (docs/RELIABILITY.md).

Verifiable blame (signed mode): each dealer signs every box's header and its recipient's x-coordinate
(:func:`~common.secagg.signing.header_message`), each recipient checks its boxes' signatures (one that fails
is a complaint), and an answer carries, beside each share of another client's secret, the header and
signature it was checked against. So an answer holding another share than the relayed box's header commits
to, or another header than the relayed box's under a signature that fails, is refused when it arrives (its
sender is one more survivor that did not answer), and a dealer whose shares rebuild to another secret than
it committed to is blamed by a proof anyone holding the run's CA can check (:func:`blame_proof`,
:func:`check_blame`): ``t`` shares each under the dealer's own signature. A client that answered a session
takes part in its restart only for a sum without the clients so proven and without anyone else removed
(``client/secure.py``): a coordinator that names an honest client cannot prove it, and the difference of two
sums is then the proven culprits' inputs alone.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import os
import struct
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.primitives import (
    SecAggError,
    combine,
    exchange,
    keypair,
    masked,
    point_fingerprint,
    ring_add,
    ring_zeros,
    share,
    unmask,
)
from common.secagg.signing import Signer, Verifier, header_message, keys_message, survivors_message


def default_threshold(clients: int, signed: bool = False) -> int:
    """``floor(n / 2) + 1``: a majority must finish (and no minority can unmask an individual). Signed
    (against a coordinator that deviates): ``floor(2n / 3) + 1``, so that a coordinator splitting its unmask
    requests between two groups still needs ``2t - n > n / 3`` colluding clients."""
    return 2 * clients // 3 + 1 if signed else clients // 2 + 1


KEY_BYTES = 32  # an X25519 public key
COMMITMENT_BYTES = 32  # SHA-256
SEED_BYTES = 16  # a client's own-mask seed (one Shamir block)
PIECE_BYTES = SEED_BYTES + 2 * 16  # one recipient's shares: of the seed, and of the 32-byte mask key (two blocks)
TAG_BYTES = 32  # SHA-256 or HMAC-SHA256: a share's commitment, a box key's
BOX_HEADER_BYTES = 3 * TAG_BYTES  # in the clear: the dealer's commitments to the two shares and to the box key
BOX_BYTES = BOX_HEADER_BYTES + PIECE_BYTES + 16  # sealed: ChaCha20-Poly1305 adds its 16-byte tag
COMPLAINT = b"!"  # an unmask answer's entry for a sender whose box did not open: this tag, then the pair's box key
MAX_SIGNATURE_BYTES = 512
POSITION_BYTES = 4  # signed mode: after a box, the recipient's x-coordinate (big-endian), then the dealer's signature
SIGNED_BOX_MIN, SIGNED_BOX_MAX = BOX_BYTES + POSITION_BYTES + 1, BOX_BYTES + POSITION_BYTES + MAX_SIGNATURE_BYTES
SIGNED_SUFFIX_MIN = BOX_HEADER_BYTES + POSITION_BYTES + 1  # signed mode: an answer entry's share, then this much

# A function checking ``signature`` over ``message`` under ``certificate`` (``SecAggError`` if it does not hold):
# the run CA's ``Verifier.verify``, or ``common.secagg.signing.check_signature`` for the certificate alone.
Check = Callable[[bytes, bytes, bytes], object]


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
    """A failure the protocol can pin on particular clients (``culprits``: their indices, ``why``: per client).
    ``proofs`` (signed mode): for those the clients can check, the evidence (:func:`blame_proof`)."""

    def __init__(self, why: dict[int, str], proofs: dict[int, dict] | None = None) -> None:
        self.why = dict(sorted(why.items()))
        self.proofs = dict(proofs or {})
        super().__init__("; ".join(f"client {i}: {w}" for i, w in self.why.items()))


def _digest(tag: bytes, *fields: bytes) -> bytes:
    """SHA-256 of ``tag`` and each field with its length before it (no two field lists hash alike)."""
    h = hashlib.sha256(tag)
    for f in fields:
        h.update(struct.pack(">I", len(f)) + f)
    return h.digest()


def seed_commitment(seed: bytes, index: int, context: bytes) -> bytes:
    """SHA-256 over the step's ``context``, the client's index and its own-mask ``seed``: published in the
    advertise round, it lets the coordinator check a seed rebuilt from shares (a wrong share is caught,
    not unmasked into a wrong sum). Hiding: the seed is 128 random bits, never reused."""
    return hashlib.sha256(b"lorm-secagg-seed|" + struct.pack(">I", index) + context + b"|" + seed).digest()


def share_commitment(kind: str, share: bytes, dealer: int, recipient: int, context: bytes) -> bytes:
    """SHA-256 binding one share (``kind`` "seed": of the dealer's own-mask seed, "key": of its mask key) to
    its dealer, recipient and step. The dealer puts both in the clear in front of the box it seals for the
    recipient; the recipient checks what it opens against them, and the coordinator each share revealed to
    it. So an answerer cannot reveal another share than it was dealt, and a dealer cannot deny what it
    dealt: shares that do not rebuild the committed secret are the dealer's doing, never an honest
    recipient's. Hiding: each share is uniform (at least 128 bits) to anyone holding fewer than ``t``."""
    return _digest(b"lorm-secagg-share|", kind.encode(), struct.pack(">II", dealer, recipient), context, share)


def key_fingerprints(keys: Keys) -> tuple[bytes, bytes]:
    """The fingerprints (:func:`~common.secagg.primitives.point_fingerprint`) of ``keys``' two public keys,
    once its fields have the protocol's sizes and both keys are canonical points of no low order; else
    ``SecAggError`` naming the client and the key (checked before anything is stored or used)."""
    if len(keys.cipher_public) != KEY_BYTES or len(keys.mask_public) != KEY_BYTES:
        raise SecAggError(
            f"client {keys.index} advertised keys of {len(keys.cipher_public)} and "
            f"{len(keys.mask_public)} bytes; X25519 public keys have {KEY_BYTES}"
        )
    if len(keys.commitment) != COMMITMENT_BYTES:
        raise SecAggError(
            f"client {keys.index}'s seed commitment has {len(keys.commitment)} bytes, not {COMMITMENT_BYTES}"
        )
    return (
        point_fingerprint(keys.cipher_public, f"client {keys.index}'s share-encryption key"),
        point_fingerprint(keys.mask_public, f"client {keys.index}'s mask-agreement key"),
    )


def check_keys_form(keys: Keys) -> None:
    """``SecAggError`` unless ``keys`` has the protocol's sizes and two usable points (:func:`key_fingerprints`)."""
    key_fingerprints(keys)


def check_distinct(roster: dict[int, Keys], prints: dict[int, tuple[bytes, bytes]] | None = None) -> None:
    """``SecAggError`` if two keys of ``roster`` are the same point up to a low-order component (equal
    fingerprints; ``prints``: those already computed, by index): a copied key would let its owner's masks
    or shares be computed by the copier (or mark a coordinator relaying one client twice)."""
    seen: dict[bytes, int] = {}
    for i, k in sorted(roster.items()):
        for fingerprint in (prints or {}).get(i) or key_fingerprints(k):
            if fingerprint in seen:
                raise SecAggError(f"clients {seen[fingerprint]} and {i} advertised the same public key")
            seen[fingerprint] = i


def verify_roster(verifier: Verifier, roster: dict[int, Keys], context: bytes) -> dict[int, str]:
    """Signed mode: each roster entry's certificate is the run CA's and its signature covers this step,
    its index and its keys; no identity holds two slots. Returns each index's identity; ``SecAggError``
    naming the first entry that fails (a coordinator that substituted or moved keys, or let through an
    advertise it should have refused: it checks each signature when the advertise arrives)."""
    identities: dict[int, str] = {}
    for i, k in sorted(roster.items()):
        if not k.certificate or not k.signature:
            raise SecAggError(f"client {i}'s keys carry no certificate and signature: the run is signed")
        try:
            who = verifier.identity(k.certificate)
            message = keys_message(context, i, who, k.cipher_public, k.mask_public, k.commitment)
            verifier.verify(k.certificate, message, k.signature)
        except SecAggError as err:
            raise SecAggError(f"the roster's entry for client {i}: {err}") from None
        if who in identities.values():
            raise SecAggError(f"identity {who!r} holds two slots of the roster")
        identities[i] = who
    return identities


def box_key(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte key of one pair's boxes in one step: HKDF-SHA256 of their X25519 secret. Both directions
    share it (distinct nonces); a complaint reveals it for that one pair (:meth:`ClientSession.reveal`)."""
    secret = exchange(private, peer_public, "the sealed shares' key agreement")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-box|" + context).derive(secret)


def _subkey(root: bytes, label: bytes) -> bytes:
    return hmac.new(root, b"lorm-secagg-box-" + label, hashlib.sha256).digest()


def _aad(context: bytes, sender: int, recipient: int) -> bytes:
    return context + struct.pack(">II", sender, recipient)


def _nonce(sender: int) -> bytes:
    return struct.pack(">I", sender).rjust(12, b"\x00")


def _share_header(plaintext: bytes, sender: int, recipient: int, context: bytes) -> bytes:
    seed, key = plaintext[:SEED_BYTES], plaintext[SEED_BYTES:]
    return share_commitment("seed", seed, sender, recipient, context) + share_commitment(
        "key", key, sender, recipient, context
    )


def seal_with(root: bytes, sender: int, recipient: int, plaintext: bytes, context: bytes) -> bytes:
    """``plaintext`` (the recipient's shares) sealed under the pair's box key ``root``: in the clear, the
    dealer's commitments to both shares (:func:`share_commitment`) and to ``root`` (an HMAC: ChaCha20-Poly1305
    alone is not key-committing, and a box that opens under two keys would let its sender frame its
    recipient); then ChaCha20-Poly1305 under a key derived from ``root``, the header authenticated with it. The
    nonce is the sender's index (each pair's key is used once per direction and step)."""
    header = _share_header(plaintext, sender, recipient, context) + _subkey(root, b"commit")
    sealed = ChaCha20Poly1305(_subkey(root, b"encrypt")).encrypt(
        _nonce(sender), plaintext, _aad(context, sender, recipient) + header
    )
    return header + sealed


def seal(private: bytes, peer_public: bytes, sender: int, recipient: int, plaintext: bytes, context: bytes) -> bytes:
    """``plaintext`` for ``recipient`` only (:func:`seal_with` under the pair's :func:`box_key`)."""
    return seal_with(box_key(private, peer_public, context), sender, recipient, plaintext, context)


def open_with(root: bytes, sender: int, recipient: int, box: bytes, context: bytes) -> bytes | None:
    """The plaintext of ``box`` if it was sealed under ``root`` (its key commitment), from ``sender`` to
    ``recipient``, unchanged, and holds the shares its header commits to; else ``None``. The coordinator
    runs the same check on a box key revealed in a complaint."""
    header, sealed = box[:BOX_HEADER_BYTES], box[BOX_HEADER_BYTES:]
    if len(header) != BOX_HEADER_BYTES or not hmac.compare_digest(header[2 * TAG_BYTES :], _subkey(root, b"commit")):
        return None
    try:
        plain = ChaCha20Poly1305(_subkey(root, b"encrypt")).decrypt(
            _nonce(sender), sealed, _aad(context, sender, recipient) + header
        )
    except InvalidTag:
        return None
    return plain if header[: 2 * TAG_BYTES] == _share_header(plain, sender, recipient, context) else None


def open_box(private: bytes, peer_public: bytes, sender: int, recipient: int, box: bytes, context: bytes) -> bytes:
    """The plaintext of :func:`seal`; ``SecAggError`` if it was changed, or is not from ``sender`` to ``recipient``."""
    plain = open_with(box_key(private, peer_public, context), sender, recipient, box, context)
    if plain is None:
        raise SecAggError(f"the shares client {sender} sent to client {recipient} do not authenticate")
    return plain


def public_of(private: bytes) -> bytes:
    raw = serialization.Encoding.Raw
    return X25519PrivateKey.from_private_bytes(private).public_key().public_bytes(raw, serialization.PublicFormat.Raw)


def is_complaint(entry: bytes) -> bool:
    """Whether an unmask answer's entry is a complaint (:data:`COMPLAINT`, then nothing or a 32-byte box key)
    rather than a share (16 or 32 bytes: no complaint has either length)."""
    return entry[:1] == COMPLAINT and len(entry) in (1, 1 + KEY_BYTES)


def sign_box(signer: Signer, box: bytes, dealer: int, recipient: int, position: int, context: bytes) -> bytes:
    """Signed mode: ``box`` followed by the recipient's x-coordinate and the dealer's signature over both and
    the box's header (:func:`~common.secagg.signing.header_message`)."""
    message = header_message(context, dealer, recipient, position, box[:BOX_HEADER_BYTES])
    return box + struct.pack(">I", position) + signer.sign(message)


def split_signed(data: bytes, prefix: int) -> tuple[bytes, bytes, int, bytes]:
    """``(front, header, position, signature)`` of a signed box (``prefix`` = :data:`BOX_BYTES`: the front is the
    box) or of a signed answer entry (``prefix`` = the share's size: the front is the share, then the box's
    header, position and signature). ``SecAggError`` if ``data`` cannot be one."""
    least = prefix + POSITION_BYTES + 1 + (0 if prefix == BOX_BYTES else BOX_HEADER_BYTES)
    if not least <= len(data) <= least - 1 + MAX_SIGNATURE_BYTES:
        raise SecAggError(f"a signed entry of {len(data)} bytes: {least}..{least - 1 + MAX_SIGNATURE_BYTES} expected")
    front, rest = data[:prefix], data[prefix:]
    header = front[:BOX_HEADER_BYTES] if prefix == BOX_BYTES else rest[:BOX_HEADER_BYTES]
    if prefix != BOX_BYTES:
        rest = rest[BOX_HEADER_BYTES:]
    (position,) = struct.unpack(">I", rest[:POSITION_BYTES])
    return front, header, position, rest[POSITION_BYTES:]


def check_dealt(
    check: Check, certificate: bytes, dealer: int, recipient: int, header: bytes, position: int, sig: bytes, ctx: bytes
) -> None:
    """``SecAggError`` unless ``dealer`` (its certificate) signed ``header`` and ``position`` for ``recipient``."""
    if position < 1:
        raise SecAggError(f"client {dealer}'s box for client {recipient} names x-coordinate {position}")
    try:
        check(certificate, header_message(ctx, dealer, recipient, position, header), sig)
    except SecAggError as err:
        raise SecAggError(f"client {dealer}'s box for client {recipient} is not signed by it: {err}") from None


def _share_kind(owner: int, survivors: list[int]) -> tuple[str, int, str]:
    """What an answer reveals of ``owner``: ``(kind, size, what)``: a survivor's seed, a dropped client's mask key."""
    return ("seed", SEED_BYTES, "own-mask seed") if owner in survivors else ("key", 2 * 16, "mask key")


def check_entry(
    check: Check | None,
    certificate: bytes,
    owner: int,
    answerer: int,
    entry: bytes,
    survivors: list[int],
    context: bytes,
) -> tuple[bytes, int]:
    """Signed mode: ``(share, position)`` of answerer's ``entry`` for ``owner``'s secret once it is a share ``owner``
    dealt it: the share matches the header's commitment, and the header and position carry ``owner``'s signature
    (checked when ``check`` is given). ``SecAggError`` naming what fails: the answerer revealed what it was not
    dealt, since an honest one reveals only a share it opened from a box so signed."""
    kind, size, what = _share_kind(owner, survivors)
    share_, header, position, sig = split_signed(entry, size)
    if check is not None:
        check_dealt(check, certificate, owner, answerer, header, position, sig, context)
    index = 0 if kind == "seed" else 1
    if share_commitment(kind, share_, owner, answerer, context) != header[index * TAG_BYTES : (index + 1) * TAG_BYTES]:
        raise SecAggError(f"client {answerer} revealed a share of client {owner}'s {what} unlike the one dealt it")
    return share_, position


def _rebuilt_at(entries: dict[int, tuple[bytes, int]], threshold: int) -> bytes:
    """The secret from shares at the x-coordinates their dealer signed (answerer -> (share, position))."""
    positions = sorted(p for _, p in entries.values())
    if len(positions) < threshold or len(set(positions)) != len(positions):
        raise SecAggError(f"x-coordinates {positions} among the shares: {threshold} distinct needed")
    pieces = {a: [s[k : k + 16] for k in range(0, len(s), 16)] for a, (s, _) in entries.items()}
    return combine(pieces, {a: p for a, (_, p) in entries.items()}, threshold)


def blame_proof(owner: Keys, survivors: list[int], entries: dict[int, bytes], context: bytes) -> dict:
    """The evidence that ``owner`` dealt shares of another secret than it committed to (signed mode): its
    signed advertise (the commitment: a seed's, or the mask key's public half), and ``t`` answer entries each
    holding a share under ``owner``'s signature (:func:`check_entry`). JSON; checked by :func:`check_blame`."""
    k = owner
    fields = (k.cipher_public, k.mask_public, k.commitment, k.certificate, k.signature)
    return {
        "dealer": k.index,
        "secret": _share_kind(k.index, survivors)[0],
        "context": context.hex(),
        "keys": [f.hex() for f in fields],
        "entries": {str(a): e.hex() for a, e in sorted(entries.items())},
    }


def check_blame(proof: dict, verifier: Verifier, context: bytes, threshold: int) -> int:
    """The client a :func:`blame_proof` proves to have dealt shares of another secret than it committed to, once
    every part holds under the run's CA for ``context`` (the session the proof names); ``SecAggError`` saying which
    part does not (a coordinator blaming a client it cannot prove)."""
    try:
        dealer, secret = int(proof["dealer"]), str(proof["secret"])
        keys = Keys(dealer, *(bytes.fromhex(f) for f in proof["keys"]))
        entries = {int(a): bytes.fromhex(e) for a, e in dict(proof["entries"]).items()}
        claimed = bytes.fromhex(proof["context"])
    except (KeyError, TypeError, ValueError) as err:
        raise SecAggError(f"a blame proof that does not parse: {err!r}") from None
    if claimed != context or secret not in ("seed", "key"):
        raise SecAggError(f"a blame proof of client {dealer} for another session, or of a secret {secret!r}")
    verify_roster(verifier, {dealer: keys}, context)  # its certificate, and its signed advertise of the session
    if len(entries) != threshold or dealer in entries:
        raise SecAggError(f"a blame proof of client {dealer} needs {threshold} other clients' shares of its secret")
    survivors = [dealer] if secret == "seed" else []
    dealt = {
        a: check_entry(verifier.verify, keys.certificate, dealer, a, e, survivors, context) for a, e in entries.items()
    }
    rebuilt = _rebuilt_at(dealt, threshold)
    holds = (
        _seed_matches(keys.commitment, dealer, context, rebuilt)
        if secret == "seed"
        else _key_matches(keys.mask_public, rebuilt)
    )
    if holds:
        raise SecAggError(f"a blame proof of client {dealer} whose shares rebuild the secret it committed to")
    return dealer


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
        self.complaints: list[int] = []  # the senders whose boxes did not open (set by reveal)

    def advertise(self) -> Keys:
        return self.keys

    def share(self, roster: dict[int, Keys]) -> dict[int, bytes]:
        """Sealed shares of the seed and mask key for every other client of ``roster`` (``U1``)."""
        if roster.get(self.index) != self.keys:
            raise SecAggError(f"the roster does not hold client {self.index}'s advertised keys")
        if len(roster) < self.threshold:
            raise SecAggError(f"a roster of {len(roster)} clients, fewer than the threshold {self.threshold}")
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
    revealed: dict[int, dict[int, bytes]] = field(default_factory=dict)  # answerer -> owner -> share or complaint
    confirmations: dict[int, bytes] = field(default_factory=dict)  # signed mode: survivor -> its signed request
    received: dict[str, int] = field(default_factory=dict)  # round -> bytes the clients sent in it
    prints: dict[int, tuple[bytes, bytes]] = field(default_factory=dict, repr=False)  # keys' fingerprints (a cache)
    signed: bool = False  # the signed mode: boxes and answers carry their dealers' signatures (verifiable blame)
    # Signed mode: checks a signature under a roster certificate (the caller's: the run CA's when it has it), for an
    # answer's header unlike the relayed box's and for a proof's shares. None: not checked here (the clients check
    # them); their form, the x-coordinates and the shares' commitments still are.
    check: Check | None = field(default=None, repr=False, compare=False)

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
        prints = key_fingerprints(keys)  # sizes; no low-order or non-canonical point (each peer would raise on it)
        if keys.index in self.keys:
            if self.keys[keys.index] != keys:
                raise SecAggError(f"client {keys.index} advertised different keys twice")
            return
        for i, k in self.keys.items():
            if i not in self.prints:  # a resumed session's keys: fingerprinted once
                self.prints[i] = key_fingerprints(k)
        check_distinct({**self.keys, keys.index: keys}, {**self.prints, keys.index: prints})
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
        if sorted(boxes) != sorted(j for j in self.roster if j != sender):
            raise SecAggError(f"client {sender} must send shares to each other client of the roster, once")
        sizes = {len(b) for b in boxes.values()}
        if not self.signed and sizes - {BOX_BYTES}:
            raise SecAggError(
                f"client {sender}'s sealed shares must be {BOX_BYTES} bytes each, got sizes {sorted(sizes)}"
            )
        if self.signed:  # the signatures: each recipient checks its own (n - 1 a client, not n^2 here)
            position = {j: k + 1 for k, j in enumerate(sorted(self.roster))}
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
        """Survivor ``answerer``'s unmask answer: for each client of ``U2`` its share (of a survivor's seed,
        16 bytes; of a dropped client's mask key, 32), or for another client a complaint (:func:`is_complaint`)
        that its box did not open. Checked for form only; what the shares are worth, :meth:`result` checks."""
        survivors, dropped = self.close_inputs()
        if answerer not in survivors:
            raise SecAggError(f"client {answerer} answered the unmask request but is not a survivor")
        want = {j: 16 for j in survivors} | {j: 32 for j in dropped}
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
        return self._from_survivors(len(self.revealed), late)

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
        positions = sorted(roster)  # the x-coordinates each client's shares were made for
        blamed, _ = self.complaint_verdicts()
        proofs: dict[int, dict] = {}
        liars = {} if self.signed else self._wrong_shares(survivors)  # signed: each share checked on arrival
        if liars:
            raise Culprits(blamed | liars)
        seeds: dict[int, bytes] = {}
        keys: dict[int, bytes] = {}
        for j in survivors + dropped:
            answers = {a: s[j] for a, s in self.revealed.items() if not is_complaint(s[j])}
            if j in survivors:
                pieces = {a: [s] for a, s in answers.items()}
                check = functools.partial(_seed_matches, roster[j].commitment, j, self.context)
                what = "own-mask seed"
            else:
                pieces = {a: [s[:16], s[16:]] for a, s in answers.items()}
                check = functools.partial(_key_matches, roster[j].mask_public)
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
        if blamed and (len(seeds) < len(survivors) or len(keys) < len(dropped)):
            raise Culprits(blamed, proofs)
        publics = {j: roster[j].mask_public for j in self.sharers}
        return unmask(self.total, survivors, keys, seeds, publics, self.context)

    def _rebuild_signed(
        self,
        owner: int,
        answers: dict[int, bytes],
        survivors: list[int],
        check: Callable[[bytes], bool],
        what: str,
        positions: list[int],
    ) -> bytes:
        """Signed mode: ``owner``'s secret from the answers' shares, as in the honest mode (each share checked on
        arrival at the x-coordinate of its recipient's place, which the dealer signed: the same Lagrange
        coefficients for every owner). A secret that fails ``check`` is rebuilt again from ``threshold`` shares
        under the owner's signature alone: if that one passes, the owner's own answer was wrong and it is the
        secret; if not, :class:`Culprits` names the owner with the proof (:func:`blame_proof`), or without one when
        fewer than ``threshold`` other clients answered."""
        assert self.roster is not None
        _, size, _ = _share_kind(owner, survivors)
        pieces = {a: [e[k : k + 16] for k in range(0, size, 16)] for a, e in answers.items()}
        try:
            return rebuild(pieces, positions, self.threshold, check, owner, what)
        except Culprits:
            pass  # the proof's path below: the owner's own answer may be the wrong share
        why = f"dealt shares of its {what} that rebuild to another value than it committed to"
        cert = self.roster[owner].certificate
        dealt: dict[int, tuple[bytes, int]] = {}
        for a, e in sorted(answers.items()):  # the proof's shares: each under the owner's signature, checked here
            if a != owner and len(dealt) < self.threshold:
                try:
                    dealt[a] = check_entry(self.check, cert, owner, a, e, survivors, self.context)
                except SecAggError:
                    continue  # a box its owner did not sign, which a dishonest recipient answered from anyway
        if len(dealt) < self.threshold:
            raise Culprits({owner: why})
        chosen = dict(sorted(dealt.items())[: self.threshold])
        secret = _rebuilt_at(chosen, self.threshold)
        if check(secret):
            return secret
        proof = blame_proof(self.roster[owner], survivors, {a: answers[a] for a in chosen}, self.context)
        raise Culprits({owner: why + " (its own signatures prove it)"}, {owner: proof})

    def _wrong_shares(self, survivors: list[int]) -> dict[int, str]:
        """The answerers that revealed a share other than the one its dealer committed to dealing them. An
        honest answerer reveals exactly what it opened, which it checked against the same commitment."""
        liars: dict[int, str] = {}
        for a, answer in sorted(self.revealed.items()):
            for j, s in sorted(answer.items()):
                if j == a or is_complaint(s):
                    continue  # an answerer's share of its own secret has no box: a lie there is its own deal
                kind, what, header = ("seed", "own-mask seed", 0) if j in survivors else ("key", "mask key", 1)
                committed = self.boxes[j][a][header * TAG_BYTES : (header + 1) * TAG_BYTES]
                if share_commitment(kind, s, j, a, self.context) != committed:
                    liars[a] = f"revealed a wrong share of client {j}'s {what}"
        return liars

    def complaint_verdicts(self) -> tuple[dict[int, str], list[str]]:
        """Who is to blame for each complaint of the unmask answers: ``(blamed, unresolved)``, client -> why,
        and what could not be told. Client ``a`` complained about ``x``'s box, revealing the pair's box key
        ``K`` (honest mode); the coordinator holds both boxes of the pair, each committing to its sealer's key:

        1. ``x``'s box commits to ``K``: ``K`` is the key ``x`` sealed with, and the box is judged under it. It
           does not open (garbage, or shares unlike its header): ``x`` is blamed; it opens: the complaint is
           false and ``a`` is blamed (it reached the same verdict under the same key).
        2. Otherwise ``a``'s own box for ``x`` must commit to ``K`` and open under it, or ``a`` revealed another
           key than its own and is blamed. Then the pair disagrees on its key. ``x`` is blamed if it answered
           without complaining about ``a``: it opened ``a``'s box, so its key is ``K`` too, and it sealed under
           another (an honest ``x`` that used the pair's key would have fallen under 1). If ``x`` complained
           back or did not answer, nobody can be named, unless at least ``t`` clients complain so about ``x``
           (a coalition of ``t`` can unmask any input anyway: the protocol's bound).

        A complaint without a key (signed mode) is recorded as unresolved. No rule blames an honest client:
        an honest accuser's key is the pair's, its own box commits to it, and an honest dealer's box opens
        under it; an honest accused seals under the pair's key, so only rule 1 applies to it."""
        blamed: dict[int, str] = {}
        unresolved: list[str] = []
        disputed: dict[int, list[int]] = {}
        for a, answer in sorted(self.revealed.items()):
            for x, entry in sorted(answer.items()):
                if x == a or not is_complaint(entry):
                    continue
                root = entry[1:]
                if not root:
                    unresolved.append(f"client {a} reports that client {x}'s box does not open (no key revealed)")
                    continue
                theirs, mine = self.boxes[x][a], self.boxes[a][x]
                if hmac.compare_digest(theirs[2 * TAG_BYTES : BOX_HEADER_BYTES], _subkey(root, b"commit")):
                    if open_with(root, x, a, theirs, self.context) is None:
                        blamed[x] = f"sealed shares for client {a} that do not open under the key it committed to"
                    else:
                        blamed[a] = f"complained about client {x}'s shares, which open under the pair's key"
                elif open_with(root, a, x, mine, self.context) is None:
                    blamed[a] = f"complained about client {x}'s shares revealing a key its own box did not use"
                elif x in self.revealed and not is_complaint(self.revealed[x].get(a, COMPLAINT)):
                    blamed[x] = (
                        f"sealed shares for client {a} that do not open under the pair's key (client {a}'s box for "
                        "it proves the key, and it opened that box without complaint)"
                    )
                else:
                    disputed.setdefault(x, []).append(a)
        for x, accusers in sorted(disputed.items()):
            if x in blamed:
                continue
            if len(accusers) >= self.threshold:
                blamed[x] = (
                    f"{len(accusers)} clients (the threshold {self.threshold}) found its boxes sealed under another key"
                )
            else:
                unresolved.append(f"clients {accusers} and client {x} disagree on their pairs' box keys")
        return blamed, unresolved


def _seed_matches(commitment: bytes, index: int, context: bytes, seed: bytes) -> bool:
    return seed_commitment(seed, index, context) == commitment


def _key_matches(public: bytes, private: bytes) -> bool:
    return public_of(private) == public


def rebuild(
    pieces: dict[int, list[bytes]],
    positions: list[int],
    threshold: int,
    check: Callable[[bytes], bool],
    owner: int,
    what: str,
) -> bytes:
    """The secret of client ``owner`` from the answers ``pieces`` (answerer -> its shares), checked by ``check``.

    Every share here is one ``owner`` committed to dealing (:meth:`ServerSession.result` left out any other,
    and named its answerer), so any ``threshold`` of them rebuild what ``owner`` dealt: a secret that fails
    the check means ``owner`` dealt shares of another secret than it committed to, and :class:`Culprits` names
    ``owner``, never an answerer. Fewer than ``threshold`` shares (complaints left the others out):
    ``SecAggError``."""
    if len(pieces) < threshold:
        raise SecAggError(
            f"client {owner}'s {what}: {len(pieces)} shares left, fewer than the threshold {threshold} (the others' "
            "boxes did not open)"
        )
    secret = combine(pieces, positions, threshold)
    if not check(secret):
        raise Culprits({owner: f"dealt shares of its {what} that rebuild to another value than it committed to"})
    return secret


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
        "signed": session.signed,
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
        signed=bool(state.get("signed", False)),
    )
