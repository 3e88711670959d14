"""Secure aggregation's authenticated boxes: how one client's shares for another cross the coordinator.

A box is sealed with ChaCha20-Poly1305 under the pair's box key (:func:`box_key`: HKDF of the pair's X25519
secret), behind a header in the clear: the dealer's commitments to the two shares inside
(:func:`~common.secagg.rounds.share_commitment`) and to the box key. So what a recipient opens
(:func:`open_box`), and what the coordinator judges under a key revealed in a complaint
(``verdicts.py``, by :func:`open_with`), is what the dealer committed to. Also the form of an unmask
answer's complaint entry (:func:`is_complaint`). The sizes are ``rounds.py``'s; the signed mode's signature
over a box's header is ``blame.py``'s.
"""

from __future__ import annotations

import hashlib
import hmac
import struct

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.ciphers.aead import ChaCha20Poly1305
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg.primitives import SecAggError, exchange
from common.secagg.rounds import BOX_HEADER_BYTES, COMPLAINT, KEY_BYTES, SEED_BYTES, TAG_BYTES, share_commitment


def box_key(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte key of one pair's boxes in one step: HKDF-SHA256 of their X25519 secret. Both directions
    share it (distinct nonces); a complaint reveals it for that one pair (:meth:`ClientSession.reveal`)."""
    secret = exchange(private, peer_public, "the sealed shares' key agreement")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-box|" + context).derive(secret)


def subkey(root: bytes, label: bytes) -> bytes:
    """The key labelled ``label`` (``commit``: the header's key commitment, ``encrypt``) derived from a
    pair's box key ``root``."""
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
    header = _share_header(plaintext, sender, recipient, context) + subkey(root, b"commit")
    sealed = ChaCha20Poly1305(subkey(root, b"encrypt")).encrypt(
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
    if len(header) != BOX_HEADER_BYTES or not hmac.compare_digest(header[2 * TAG_BYTES :], subkey(root, b"commit")):
        return None
    try:
        plain = ChaCha20Poly1305(subkey(root, b"encrypt")).decrypt(
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
