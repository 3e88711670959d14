"""Secure aggregation's rounds: the protocol of one step, and what both its sides share.

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
(:func:`~common.secagg.signed_messages.header_message`), each recipient checks its boxes' signatures (one
that fails is a complaint), and an answer carries, beside each share of another client's secret, the header and
signature it was checked against. So an answer holding another share than the relayed box's header commits
to, or another header than the relayed box's under a signature that fails, is refused when it arrives (its
sender is one more survivor that did not answer), and a dealer whose shares rebuild to another secret than
it committed to is blamed by a proof anyone holding the run's CA can check (:func:`blame_proof`,
:func:`check_blame`): ``t`` shares each under the dealer's own signature. A client that answered a session
takes part in its restart only for a sum without the clients so proven and without anyone else removed
(``client/secure.py``): a coordinator that names an honest client cannot prove it, and the difference of two
sums is then the proven culprits' inputs alone.

This module holds what both sides share: the threshold (:func:`default_threshold`), the protocol's sizes,
the advertised :class:`Keys`, :class:`Culprits`, the commitments, and the checks of advertised keys and of
a roster. Its siblings, each built on it: ``boxes.py`` (the authenticated boxes: :func:`box_key`,
:func:`seal_with`, :func:`open_with`, :func:`is_complaint`), ``blame.py`` (the signed mode's signed boxes
and blame proofs: :func:`sign_box`, :func:`check_entry`, :func:`blame_proof`, :func:`check_blame`),
``client_session.py`` (:class:`ClientSession`), ``server_session.py`` (:class:`ServerSession`),
``verdicts.py`` (the coordinator's verdicts on the unmask answers: :func:`rebuild`,
:meth:`ServerSession.complaint_verdicts`) and ``persistence.py`` (:func:`session_state`,
:func:`session_from_state`).
"""

from __future__ import annotations

import hashlib
import struct
from collections.abc import Callable
from dataclasses import dataclass

from common.secagg.primitives import SecAggError, point_fingerprint
from common.secagg.signed_messages import keys_message
from common.secagg.signing import Verifier


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
