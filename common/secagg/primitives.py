"""Secure aggregation's primitives (SecAgg, Bonawitz et al. 2017): the coordinator learns only sums.

Every value a client would send is encoded in fixed point on the ring ``Z_2^128`` (:func:`encode`)
and masked before it leaves the client (:func:`masked`): ``y_i = x_i + b_i + sum_{j>i} s_ij -
sum_{j<i} s_ij (mod 2^128)``. ``s_ij = PRG(KDF(DH(sk_i, pk_j), context))`` is a pairwise mask that
clients ``i`` and ``j`` both derive from an X25519 key agreement and that cancels in the sum;
``b_i = PRG(seed_i)`` is the client's own mask, which keeps ``y_i`` hidden even when a pairwise
partner's key is reconstructed. Each client Shamir-shares its seed and its X25519 private key
among the others (:func:`share`, threshold ``t``). After the step the coordinator asks the
survivors for shares: of each survivor's seed (to remove ``b_i``) and of each dropped client's
private key (to remove the pairwise masks that no longer cancel), and :func:`unmask` gives the
sum of the survivors' values. No share of both secrets of one client is ever requested.

Primitives come from well-kept libraries only: X25519, HKDF-SHA256 and ChaCha20 (the PRG) from
``cryptography``; Shamir's scheme is ``shamir.py``'s, over GF(2^16) symbol by symbol (a share is as long
as its secret; 16-byte pieces, a 32-byte key travelling as two). A ring element is two ``uint64`` limbs (low,
high; an array of shape ``(n, 2)``), added with carry (:func:`ring_add`); numpy's ``uint64`` addition wraps
modulo ``2^64`` by definition.

Precision (:class:`FixedPoint`): a value ``x`` with ``|x| <= bound`` encodes as ``round(x 2^f)``,
``f = 64`` by default: the grid ``2^-64`` lies below float64's own rounding for any value over
``2^-11``, so an unmasked sum equals the exact sum of the clients' float64 terms to float64's
precision (the plain merge's float additions round at that level too). The decoded sum of ``n``
values differs from their exact sum by at most ``n 2^-(f+1)`` plus one float64 rounding.
:meth:`FixedPoint.check` refuses a ``(bound, f, n)`` whose sums could reach ``2^126`` (headroom
under ``2^127``), every client refuses a value over ``bound`` before masking, and :func:`decode`
refuses a sum beyond ``n * bound``: overflow is detected, not wrapped.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from common.secagg import shamir

RING_BITS = 128
HEADROOM_BITS = 126  # honest sums stay below 2^126 in magnitude: anything beyond is an overflow
TWO64 = 2.0**64


class SecAggError(ValueError):
    """A value, sum or share that secure aggregation cannot handle (with what and why)."""


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point encoding of reals in ``[-bound, bound]`` with ``frac_bits`` fractional bits."""

    frac_bits: int = 64
    bound: float = 2.0**40

    def check(self, clients: int) -> None:
        """``SecAggError`` unless ``clients`` values of at most ``bound`` sum below ``2^126`` once encoded."""
        if not (0 <= self.frac_bits <= 96 and self.bound > 0 and math.isfinite(self.bound)):
            raise SecAggError(f"fixed point: expected 0 <= frac_bits <= 96 and a finite bound > 0, got {self}")
        if clients * self.bound * 2.0**self.frac_bits >= 2.0**HEADROOM_BITS:
            raise SecAggError(
                f"fixed point: {clients} clients x bound {self.bound:g} x 2^{self.frac_bits} reaches "
                f"2^{HEADROOM_BITS}: lower the bound or the fractional bits"
            )

    def error_bound(self, clients: int) -> float:
        """The most a decoded sum of ``clients`` values can differ from their exact sum (rounding to the grid)."""
        return clients * 2.0 ** -(self.frac_bits + 1)


def ring_zeros(count: int) -> np.ndarray:
    return np.zeros((count, 2), dtype=np.uint64)


def ring_add(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """``a + b (mod 2^128)`` limb by limb, the low limb's carry into the high one."""
    low = a[:, 0] + b[:, 0]
    carry = (low < a[:, 0]).astype(np.uint64)
    return np.stack([low, a[:, 1] + b[:, 1] + carry], axis=1)


def ring_neg(a: np.ndarray) -> np.ndarray:
    """``-a (mod 2^128)``: the complement plus one."""
    return ring_add(~a, np.stack([np.ones(len(a), np.uint64), np.zeros(len(a), np.uint64)], axis=1))


def ring_sub(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return ring_add(a, ring_neg(b))


class RingSum:
    """A signed sum of many ring vectors of one length, one in-place numpy addition each.

    Each term's 128-bit elements are read as four 32-bit digits and added into ``uint64`` counters, the added
    terms and the subtracted ones apart; a counter holds at most ``2^31`` terms' digits without overflow, and
    :meth:`value` carries the digits once. The result is the same ring element as a chain of
    :func:`ring_add` and :func:`ring_sub`, at a fraction of the cost (no carry per term)."""

    LIMIT = 2**31

    def __init__(self, count: int) -> None:
        self._digits = {+1: np.zeros(4 * count, np.uint64), -1: np.zeros(4 * count, np.uint64)}
        self._count, self._terms = count, 0

    def add(self, term: np.ndarray, sign: int = +1) -> None:
        """Adds ``term`` (``(count, 2)`` limbs) with ``sign`` +1 or -1."""
        if self._terms >= self.LIMIT:
            raise SecAggError(f"ring sum: more than {self.LIMIT} terms")
        digits = np.ascontiguousarray(term, dtype="<u8").reshape(-1).view("<u4")
        if digits.size != 4 * self._count:
            raise SecAggError(f"ring sum: a term of {digits.size // 4} elements, expected {self._count}")
        np.add(self._digits[sign], digits, out=self._digits[sign])
        self._terms += 1

    def value(self) -> np.ndarray:
        """The sum so far, as ``(count, 2)`` limbs (mod 2^128)."""
        return ring_sub(self._carried(+1), self._carried(-1))

    def _carried(self, sign: int) -> np.ndarray:
        digits = self._digits[sign].reshape(-1, 4)
        out, carry = np.empty((self._count, 4), np.uint64), np.zeros(self._count, np.uint64)
        for d in range(4):
            column = digits[:, d] + carry
            out[:, d], carry = column & np.uint64(0xFFFFFFFF), column >> np.uint64(32)
        return np.stack([out[:, 0] | (out[:, 1] << np.uint64(32)), out[:, 2] | (out[:, 3] << np.uint64(32))], axis=1)


def encode(x: np.ndarray, fp: FixedPoint) -> np.ndarray:
    """``round(x 2^f)`` as ring elements (two's complement, ``(n, 2)`` limbs); ``SecAggError`` if
    ``|x| > bound`` or not finite. Exact: ``x 2^f`` is a float64 whose integer part splits into limbs
    without rounding."""
    x = np.asarray(x, dtype=np.float64).reshape(-1)
    if not np.isfinite(x).all():
        raise SecAggError("fixed point: a value to aggregate is not finite")
    if x.size and float(np.abs(x).max()) > fp.bound:
        raise SecAggError(
            f"fixed point: a value of magnitude {float(np.abs(x).max()):g} exceeds the bound {fp.bound:g} "
            "(setting secagg.bound)"
        )
    return _signed(np.rint(x * 2.0**fp.frac_bits))


def _signed(v: np.ndarray) -> np.ndarray:
    """Integer-valued floats as ring elements: the magnitude split into limbs (exact: below 2^64 it is
    the low limb itself, above it its ulp is a multiple of 2^11), negated in the ring where negative."""
    m = np.abs(v)
    high = np.floor(m / TWO64)
    out = np.stack([(m - high * TWO64).astype(np.uint64), high.astype(np.uint64)], axis=1)
    negative = v < 0
    out[negative] = ring_neg(out[negative])
    return out


def _real(total: np.ndarray) -> np.ndarray:
    """Inverse of :func:`_signed` (one float64 rounding): the magnitude of each two's-complement element, signed."""
    negative = total[:, 1] >= np.uint64(2**63)
    m = total.copy()
    m[negative] = ring_neg(m[negative])
    value = m[:, 1].astype(np.float64) * TWO64 + m[:, 0].astype(np.float64)
    return np.where(negative, -value, value)


def decode(total: np.ndarray, fp: FixedPoint, clients: int) -> np.ndarray:
    """The real sum of ``clients`` encoded values from their ring sum; ``SecAggError`` beyond ``clients * bound``."""
    real = _real(np.asarray(total, dtype=np.uint64).reshape(-1, 2))
    if real.size and float(np.abs(real).max()) > clients * fp.bound * 2.0**fp.frac_bits:
        raise SecAggError(
            f"fixed point: an unmasked sum lies beyond {clients} x bound {fp.bound:g}: an overflow or a "
            "value outside the bound; the step's sum is refused"
        )
    return real / 2.0**fp.frac_bits


# ------------------------------------------------------------------------- keys and masks


def keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair: ``(private, public)``, 32 raw bytes each."""
    private = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    return (
        private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
        private.public_key().public_bytes(raw, serialization.PublicFormat.Raw),
    )


P25519 = 2**255 - 19  # the field of Curve25519: a canonical X25519 encoding is a u-coordinate below it
_PROBE = X25519PrivateKey.from_private_bytes(hashlib.sha256(b"lorm-secagg-point-probe").digest())


def point_fingerprint(public: bytes, what: str) -> bytes:
    """The 32-byte value every honest key agreement with ``public`` depends on: its X25519 exchange with a
    fixed key. ``SecAggError`` naming ``what`` for a key no honest client makes:

    - a non-canonical encoding (``u >= 2^255 - 19``, the high bit included): the same point as ``u mod p``
      under other bytes, which would pass a byte-wise check of distinct keys (a copied key in disguise);
    - a low-order point (the eight of Curve25519's small subgroup and of its twist, any encoding): the
      exchange with it is all-zero for every clamped private key, so every peer's exchange raises (the
      attack that crashed every honest client) and its "secret" is public.

    A point with a low-order component added (``P + T``) gives the same exchange as ``P`` with every
    clamped key: equal fingerprints, so :func:`common.secagg.rounds.check_distinct` and the coordinator's
    memory of earlier steps' keys compare fingerprints, not bytes."""
    if len(public) != 32:
        raise SecAggError(f"{what}: an X25519 public key has 32 bytes, got {len(public)}")
    u = int.from_bytes(public, "little")
    if u >= P25519:
        raise SecAggError(
            f"{what} is not a canonical X25519 encoding (its u-coordinate is at least 2^255 - 19"
            f"{', its high bit set' if u >> 255 else ''}): no honest key pair gives it"
        )
    try:
        return _PROBE.exchange(X25519PublicKey.from_public_bytes(public))
    except ValueError:  # the library refuses an all-zero shared secret
        raise SecAggError(
            f"{what} is a low-order X25519 point: every key agreement with it is all-zero (public), and no "
            "honest key pair gives it"
        ) from None


def exchange(private: bytes, peer_public: bytes, what: str) -> bytes:
    """The X25519 secret of ``private`` and ``peer_public``; ``SecAggError`` naming ``what`` where the library
    refuses it (a low-order peer key: checked at advertise, so only a coordinator that let one through)."""
    try:
        return X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    except ValueError as err:
        raise SecAggError(f"{what}: the X25519 exchange fails ({err}): a low-order or malformed key") from None


def agree(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte seed two clients share: HKDF-SHA256 of their X25519 secret, bound to ``context``
    (run, task, round, phase: a mask is never reused across steps)."""
    secret = exchange(private, peer_public, "the pairwise mask's key agreement")
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-pair|" + context).derive(secret)


def prg(seed: bytes, count: int) -> np.ndarray:
    """``count`` pseudo-random ring elements (``(count, 2)`` limbs): the ChaCha20 key stream of ``seed``
    (32 bytes), nonce zero."""
    if len(seed) != 32:
        raise SecAggError(f"prg: expected a 32-byte seed, got {len(seed)} bytes")
    encryptor = Cipher(algorithms.ChaCha20(seed, b"\x00" * 16), mode=None).encryptor()
    stream = np.frombuffer(encryptor.update(b"\x00" * (16 * count)), dtype="<u8")
    return stream.astype(np.uint64, copy=False).reshape(count, 2)


def self_seed_key(seed16: bytes, context: bytes) -> bytes:
    """The PRG key of a client's own mask from its 16-byte seed (the secret it shares)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-self|" + context).derive(seed16)


def pairwise(index: int, private: bytes, publics: dict[int, bytes], count: int, context: bytes) -> np.ndarray:
    """Client ``index``'s pairwise masks: ``sum_{j>i} s_ij - sum_{j<i} s_ij`` over the other clients of ``publics``."""
    out = RingSum(count)
    for j, public in sorted(publics.items()):
        if j == index:
            continue
        out.add(prg(agree(private, public, context), count), +1 if j > index else -1)
    return out.value()


def masked(
    values: np.ndarray, index: int, private: bytes, publics: dict[int, bytes], seed16: bytes, context: bytes
) -> np.ndarray:
    """What client ``index`` sends: its encoded ``values`` plus its own and its pairwise masks (mod 2^64)."""
    values = np.asarray(values, dtype=np.uint64).reshape(-1, 2)
    own = prg(self_seed_key(seed16, context), len(values))
    return ring_add(ring_add(values, own), pairwise(index, private, publics, len(values), context))


# ------------------------------------------------------------------------- Shamir


def share(secret: bytes, threshold: int, clients: list[int]) -> dict[int, list[bytes]]:
    """Shares of ``secret`` (16 or 32 bytes) for each of ``clients`` (ids >= 0; the ``k``-th of them at
    x-coordinate ``k + 1``), any ``threshold`` of which rebuild it: per client a list of 16-byte pieces, one per
    16-byte block of the secret (``common/secagg/shamir.py``: GF(2^16), symbol by symbol)."""
    if len(secret) not in (16, 32):
        raise SecAggError(f"share: expected a 16- or 32-byte secret, got {len(secret)} bytes")
    if not 1 <= threshold <= len(clients):
        raise SecAggError(f"share: a threshold of {threshold} among {len(clients)} clients")
    try:
        dealt = shamir.split(secret, threshold, list(range(1, len(clients) + 1)))
    except shamir.ShamirError as err:
        raise SecAggError(f"share: {err}") from None
    return {c: [d[k : k + 16] for k in range(0, len(d), 16)] for c, d in zip(clients, dealt)}


def combine(shares: dict[int, list[bytes]], clients: list[int] | Mapping[int, int], threshold: int) -> bytes:
    """The secret from the shares of at least ``threshold`` of ``clients`` (``shares``: client -> its pieces;
    ``clients``: the order :func:`share` was given, which fixes each client's x-coordinate, or a mapping of each
    client to its x-coordinate). The ``threshold`` clients of lowest id are used."""
    if len(shares) < threshold:
        raise SecAggError(f"combine: {len(shares)} shares, {threshold} needed")
    position = dict(clients) if isinstance(clients, Mapping) else {c: k + 1 for k, c in enumerate(clients)}
    chosen = sorted(shares)[:threshold]
    if any(len(piece) != 16 for c in chosen for piece in shares[c]):
        raise SecAggError("combine: a share of another size than 16 bytes")
    try:
        return shamir.interpolate({position[c]: b"".join(shares[c]) for c in chosen}, threshold)
    except shamir.ShamirError as err:
        raise SecAggError(f"combine: {err}") from None


def unmask(
    total: np.ndarray,
    survivors: list[int],
    dropped_private: dict[int, bytes],
    survivor_seeds: dict[int, bytes],
    publics: dict[int, bytes],
    context: bytes,
    adjacent: Callable[[int, int], bool] | None = None,
) -> np.ndarray:
    """The ring sum of the survivors' encoded values from the sum of their masked vectors ``total``.

    Removes each survivor's own mask (its rebuilt seed) and, for each dropped client ``j`` (its rebuilt
    private key), the pairwise masks between ``j`` and the survivors, which no longer cancel (``adjacent``: on a
    sparse graph, whether two clients masked against each other; ``None``: all did)."""
    total = np.asarray(total, dtype=np.uint64).reshape(-1, 2)
    out = RingSum(len(total))
    out.add(total)
    for i in survivors:
        out.add(prg(self_seed_key(survivor_seeds[i], context), len(total)), -1)
    for j, private in dropped_private.items():
        for i in survivors:
            if adjacent is not None and not adjacent(i, j):
                continue
            stream = prg(agree(private, publics[i], context), len(total))  # = s_ij, seen from j's side
            out.add(stream, -1 if j > i else +1)  # i added +s_ij for j > i, -s_ij for j < i
    return out.value()
