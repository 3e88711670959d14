"""The byte strings a client signs in secure aggregation's signed mode, and no others: :func:`keys_message`
(its advertised keys), :func:`survivors_message` (the unmask request it was shown), :func:`header_message`
(each box it deals).

Message format: ``PREFIX || field(kind) || field(f_1) || ... || field(f_k)`` with
``field(x) = uint32_be(len(x)) || x``, ``kind`` a fixed ASCII tag and ``k`` fixed per kind. A
message therefore parses back to exactly one (kind, fields): no two kinds and no two splits of
the same bytes into fields sign the same string. ``PREFIX`` starts with ASCII ``l``, never a TLS
handshake's ``0x01`` nor TLS 1.3's ``0x20`` padding, so a signature made here with the mTLS key
can't pass as a TLS CertificateVerify, nor one made in a handshake as a message here.

``signing.py`` signs and verifies them under the run's CA; ``rounds.py``, ``client_session.py`` and
``blame.py`` build them.
"""

from __future__ import annotations

import struct

from common.secagg.primitives import SecAggError

PREFIX = b"lorm-secagg-signed/v1\x00"
KEYS = "keys"
SURVIVORS = "survivors"
HEADER = "header"


def _field(data: bytes, what: str) -> bytes:
    if not isinstance(data, bytes):
        raise SecAggError(f"{what}: expected bytes, got {type(data).__name__}")
    if len(data) > 0xFFFFFFFF:
        raise SecAggError(f"{what}: at most 2^32 - 1 bytes, got {len(data)}")
    return struct.pack(">I", len(data)) + data


def _message(kind: str, fields: dict[str, bytes]) -> bytes:
    return PREFIX + _field(kind.encode("ascii"), "kind") + b"".join(_field(v, k) for k, v in fields.items())


def _index(value: int, what: str) -> bytes:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 0xFFFFFFFF:
        raise SecAggError(f"{what}: expected a client index in [0, 2^32), got {value!r}")
    return struct.pack(">I", value)


def _indices(values: list[int], what: str) -> bytes:
    if any(b <= a for a, b in zip(values, values[1:])):
        raise SecAggError(f"{what}: expected client indices sorted and without duplicates, got {values}")
    return b"".join(_index(v, what) for v in values)


def keys_message(
    context: bytes, index: int, identity: str, cipher_public: bytes, mask_public: bytes, commitment: bytes
) -> bytes:
    """What client ``index`` (certificate identity ``identity``) signs when it advertises its keys.

    ``context`` binds run, task, round, phase and attempt, so an advertisement can't be replayed
    into another step; ``identity`` binds the index to the certificate, so a coordinator can't
    relabel one client's advertisement as another's.
    """
    if not isinstance(identity, str) or not identity:
        raise SecAggError(f"identity: expected a client id, got {identity!r}")
    return _message(
        KEYS,
        {
            "context": context,
            "index": _index(index, "index"),
            "identity": identity.encode("utf-8"),
            "cipher_public": cipher_public,
            "mask_public": mask_public,
            "commitment": commitment,
        },
    )


def survivors_message(context: bytes, survivors: list[int], dropped: list[int]) -> bytes:
    """What a client signs in the consistency round: the survivors and dropped clients it was told.

    Both lists must be strictly increasing (sorting is the caller's job, so two honest clients
    sign the same bytes) and disjoint: an index in both would ask for both secrets of one client.
    """
    both = sorted(set(survivors) & set(dropped))
    if both:
        raise SecAggError(f"survivors and dropped: clients {both} are in both lists")
    fields = {
        "context": context,
        "survivors": _indices(survivors, "survivors"),
        "dropped": _indices(dropped, "dropped"),
    }
    return _message(SURVIVORS, fields)


def header_message(context: bytes, dealer: int, recipient: int, position: int, header: bytes) -> bytes:
    """What a dealer signs for each box it seals (signed mode): the box's header in the clear (its commitments to
    the two shares inside and to the pair's box key) and the recipient's x-coordinate ``position`` in the dealer's
    Shamir sharing. With it, any party holding the run's CA can tell a share the dealer dealt from one it did not,
    and rebuild the dealer's secret at the x-coordinates the dealer itself chose: the evidence by which a dealer whose
    shares rebuild to another secret than it committed to is blamed (``common.secagg.blame.check_blame``), and by
    which no one can frame an honest dealer."""
    fields = {
        "context": context,
        "dealer": _index(dealer, "dealer"),
        "recipient": _index(recipient, "recipient"),
        "position": _index(position, "position"),
        "header": header,
    }
    return _message(HEADER, fields)
