"""Secure aggregation's verifiable blame (signed mode): signed boxes and answers, and proofs of a wrong deal.

A dealer signs each box's header and its recipient's x-coordinate (:func:`sign_box`, over
:func:`~common.secagg.signed_messages.header_message`); the recipient checks that signature
(:func:`check_dealt`) and sends it on beside each share it reveals, which the coordinator checks against
the header (:func:`check_entry`). ``t`` such entries whose shares rebuild (:func:`rebuilt_at`) to another
secret than their dealer committed to (:func:`seed_matches`, :func:`key_matches`) are a proof anyone
holding the run's CA can check (:func:`blame_proof`, :func:`check_blame`). The boxes themselves are
``boxes.py``'s; the coordinator's use of all this when it unmasks, ``verdicts.py``'s; a client's check of
the proofs before a restart, ``client/secure.py``'s.
"""

from __future__ import annotations

import struct

from common.secagg.boxes import public_of
from common.secagg.primitives import SecAggError, combine
from common.secagg.rounds import (
    BOX_BYTES,
    BOX_HEADER_BYTES,
    MAX_SIGNATURE_BYTES,
    POSITION_BYTES,
    SEED_BYTES,
    TAG_BYTES,
    Check,
    Keys,
    seed_commitment,
    share_commitment,
    verify_roster,
)
from common.secagg.signed_messages import header_message
from common.secagg.signing import Signer, Verifier


def sign_box(signer: Signer, box: bytes, dealer: int, recipient: int, position: int, context: bytes) -> bytes:
    """Signed mode: ``box`` followed by the recipient's x-coordinate and the dealer's signature over both and
    the box's header (:func:`~common.secagg.signed_messages.header_message`)."""
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


def share_kind(owner: int, survivors: list[int]) -> tuple[str, int, str]:
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
    kind, size, what = share_kind(owner, survivors)
    share_, header, position, sig = split_signed(entry, size)
    if check is not None:
        check_dealt(check, certificate, owner, answerer, header, position, sig, context)
    index = 0 if kind == "seed" else 1
    if share_commitment(kind, share_, owner, answerer, context) != header[index * TAG_BYTES : (index + 1) * TAG_BYTES]:
        raise SecAggError(f"client {answerer} revealed a share of client {owner}'s {what} unlike the one dealt it")
    return share_, position


def rebuilt_at(entries: dict[int, tuple[bytes, int]], threshold: int) -> bytes:
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
        "secret": share_kind(k.index, survivors)[0],
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
    rebuilt = rebuilt_at(dealt, threshold)
    holds = (
        seed_matches(keys.commitment, dealer, context, rebuilt)
        if secret == "seed"
        else key_matches(keys.mask_public, rebuilt)
    )
    if holds:
        raise SecAggError(f"a blame proof of client {dealer} whose shares rebuild the secret it committed to")
    return dealer


def seed_matches(commitment: bytes, index: int, context: bytes, seed: bytes) -> bool:
    return seed_commitment(seed, index, context) == commitment


def key_matches(public: bytes, private: bytes) -> bool:
    return public_of(private) == public
