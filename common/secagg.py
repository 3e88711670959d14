"""Secure aggregation's primitives (SecAgg, Bonawitz et al. 2017): the coordinator learns only sums.

Every value a client would send is encoded in fixed point on the ring ``Z_2^64`` (:func:`encode`)
and masked before it leaves the client (:func:`masked`): ``y_i = x_i + b_i + sum_{j>i} s_ij -
sum_{j<i} s_ij (mod 2^64)``. ``s_ij = PRG(KDF(DH(sk_i, pk_j), context))`` is a pairwise mask that
clients ``i`` and ``j`` both derive from an X25519 key agreement and that cancels in the sum;
``b_i = PRG(seed_i)`` is the client's own mask, which keeps ``y_i`` hidden even when a pairwise
partner's key is reconstructed. Each client Shamir-shares its seed and its X25519 private key
among the others (:func:`share`, threshold ``t``). After the step the coordinator asks the
survivors for shares: of each survivor's seed (to remove ``b_i``) and of each dropped client's
private key (to remove the pairwise masks that no longer cancel), and :func:`unmask` gives the
sum of the survivors' values. No share of both secrets of one client is ever requested.

Primitives come from well-kept libraries only: X25519, HKDF-SHA256 and ChaCha20 (the PRG) from
``cryptography``, Shamir's scheme over GF(2^128) from ``pycryptodome`` (16-byte secrets: a 32-byte
key travels as two). Ring arithmetic is numpy ``uint64``, whose addition wraps modulo ``2^64`` by
definition.

Precision (:class:`FixedPoint`): a value ``x`` with ``|x| <= bound`` encodes as ``round(x 2^f)``;
the decoded sum of ``n`` values differs from their float sum by at most ``n 2^-(f+1)`` plus float64
rounding. :meth:`FixedPoint.check` refuses a ``(bound, f, n)`` whose sums could reach ``2^62``
(headroom to spare under ``2^63``), every client refuses a value over ``bound`` before masking, and
:func:`decode` refuses a sum beyond ``n * bound``: overflow is detected, not wrapped.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from Crypto.Protocol.SecretSharing import Shamir
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey, X25519PublicKey
from cryptography.hazmat.primitives.ciphers import Cipher, algorithms
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

RING_BITS = 64
HEADROOM_BITS = 62  # honest sums stay below 2^62 in magnitude: anything beyond is an overflow


class SecAggError(ValueError):
    """A value, sum or share that secure aggregation cannot handle (with what and why)."""


@dataclass(frozen=True)
class FixedPoint:
    """Fixed-point encoding of reals in ``[-bound, bound]`` with ``frac_bits`` fractional bits."""

    frac_bits: int = 24
    bound: float = 2.0**20

    def check(self, clients: int) -> None:
        """``SecAggError`` unless ``clients`` values of at most ``bound`` sum below ``2^62`` once encoded."""
        if not (0 <= self.frac_bits <= 52 and self.bound > 0 and math.isfinite(self.bound)):
            raise SecAggError(f"fixed point: expected 0 <= frac_bits <= 52 and a finite bound > 0, got {self}")
        if clients * self.bound * 2.0**self.frac_bits >= 2.0**HEADROOM_BITS:
            raise SecAggError(
                f"fixed point: {clients} clients x bound {self.bound:g} x 2^{self.frac_bits} reaches "
                f"2^{HEADROOM_BITS}: lower the bound or the fractional bits"
            )

    def error_bound(self, clients: int) -> float:
        """The most a decoded sum of ``clients`` values can differ from their exact sum (rounding to the grid)."""
        return clients * 2.0 ** -(self.frac_bits + 1)


def encode(x: np.ndarray, fp: FixedPoint) -> np.ndarray:
    """``round(x 2^f)`` as ring elements (``uint64``, two's complement); ``SecAggError`` if ``|x| > bound``
    or not finite."""
    x = np.asarray(x, dtype=np.float64)
    if not np.isfinite(x).all():
        raise SecAggError("fixed point: a value to aggregate is not finite")
    if x.size and float(np.abs(x).max()) > fp.bound:
        raise SecAggError(
            f"fixed point: a value of magnitude {float(np.abs(x).max()):g} exceeds the bound {fp.bound:g}"
        )
    return np.rint(x * 2.0**fp.frac_bits).astype(np.int64).view(np.uint64)


def decode(total: np.ndarray, fp: FixedPoint, clients: int) -> np.ndarray:
    """The real sum of ``clients`` encoded values from their ring sum; ``SecAggError`` beyond ``clients * bound``."""
    signed = np.asarray(total, dtype=np.uint64).view(np.int64)
    limit = clients * fp.bound * 2.0**fp.frac_bits
    if signed.size and float(np.abs(signed.astype(np.float64)).max()) > limit:
        raise SecAggError(
            f"fixed point: an unmasked sum lies beyond {clients} x bound {fp.bound:g}: an overflow or a "
            "value outside the bound; the step's sum is refused"
        )
    return signed.astype(np.float64) / 2.0**fp.frac_bits


# ------------------------------------------------------------------------- keys and masks


def keypair() -> tuple[bytes, bytes]:
    """A fresh X25519 key pair: ``(private, public)``, 32 raw bytes each."""
    private = X25519PrivateKey.generate()
    raw = serialization.Encoding.Raw
    return (
        private.private_bytes(raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()),
        private.public_key().public_bytes(raw, serialization.PublicFormat.Raw),
    )


def agree(private: bytes, peer_public: bytes, context: bytes) -> bytes:
    """The 32-byte seed two clients share: HKDF-SHA256 of their X25519 secret, bound to ``context``
    (run, task, round, phase: a mask is never reused across steps)."""
    secret = X25519PrivateKey.from_private_bytes(private).exchange(X25519PublicKey.from_public_bytes(peer_public))
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-pair|" + context).derive(secret)


def prg(seed: bytes, count: int) -> np.ndarray:
    """``count`` pseudo-random ring elements: the ChaCha20 key stream of ``seed`` (32 bytes), nonce zero."""
    if len(seed) != 32:
        raise SecAggError(f"prg: expected a 32-byte seed, got {len(seed)} bytes")
    encryptor = Cipher(algorithms.ChaCha20(seed, b"\x00" * 16), mode=None).encryptor()
    return np.frombuffer(encryptor.update(b"\x00" * (8 * count)), dtype="<u8").astype(np.uint64)


def self_seed_key(seed16: bytes, context: bytes) -> bytes:
    """The PRG key of a client's own mask from its 16-byte seed (the secret it shares)."""
    return HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=b"lorm-secagg-self|" + context).derive(seed16)


def pairwise(index: int, private: bytes, publics: dict[int, bytes], count: int, context: bytes) -> np.ndarray:
    """Client ``index``'s pairwise masks: ``sum_{j>i} s_ij - sum_{j<i} s_ij`` over the other clients of ``publics``."""
    out = np.zeros(count, dtype=np.uint64)
    for j, public in sorted(publics.items()):
        if j == index:
            continue
        stream = prg(agree(private, public, context), count)
        out = out + stream if j > index else out - stream
    return out


def masked(
    values: np.ndarray, index: int, private: bytes, publics: dict[int, bytes], seed16: bytes, context: bytes
) -> np.ndarray:
    """What client ``index`` sends: its encoded ``values`` plus its own and its pairwise masks (mod 2^64)."""
    values = np.asarray(values, dtype=np.uint64)
    own = prg(self_seed_key(seed16, context), values.size)
    return values + own + pairwise(index, private, publics, values.size, context)


# ------------------------------------------------------------------------- Shamir


def share(secret: bytes, threshold: int, clients: list[int]) -> dict[int, list[bytes]]:
    """Shares of ``secret`` (16 or 32 bytes) for each of ``clients`` (ids >= 0), any ``threshold`` of which
    rebuild it: per client a list of 16-byte shares, one per 16-byte block (pycryptodome's Shamir)."""
    if len(secret) not in (16, 32):
        raise SecAggError(f"share: expected a 16- or 32-byte secret, got {len(secret)} bytes")
    if not 1 <= threshold <= len(clients):
        raise SecAggError(f"share: a threshold of {threshold} among {len(clients)} clients")
    out: dict[int, list[bytes]] = {c: [] for c in clients}
    for start in range(0, len(secret), 16):
        shares = Shamir.split(threshold, len(clients), secret[start : start + 16])
        for c, (_, piece) in zip(clients, shares):
            out[c].append(piece)
    return out


def combine(shares: dict[int, list[bytes]], clients: list[int], threshold: int) -> bytes:
    """The secret from the shares of at least ``threshold`` of ``clients`` (``shares``: client -> its pieces;
    ``clients``: the order :func:`share` was given, which fixes each client's x-coordinate)."""
    if len(shares) < threshold:
        raise SecAggError(f"combine: {len(shares)} shares, {threshold} needed")
    position = {c: k + 1 for k, c in enumerate(clients)}
    chosen = sorted(shares)[:threshold]
    blocks = len(shares[chosen[0]])
    return b"".join(Shamir.combine([(position[c], shares[c][b]) for c in chosen]) for b in range(blocks))


def unmask(
    total: np.ndarray,
    survivors: list[int],
    dropped_private: dict[int, bytes],
    survivor_seeds: dict[int, bytes],
    publics: dict[int, bytes],
    context: bytes,
) -> np.ndarray:
    """The ring sum of the survivors' encoded values from the sum of their masked vectors ``total``.

    Removes each survivor's own mask (its rebuilt seed) and, for each dropped client ``j`` (its rebuilt
    private key), the pairwise masks between ``j`` and the survivors, which no longer cancel."""
    out = np.asarray(total, dtype=np.uint64).copy()
    for i in survivors:
        out = out - prg(self_seed_key(survivor_seeds[i], context), out.size)
    for j, private in dropped_private.items():
        for i in survivors:
            stream = prg(agree(private, publics[i], context), out.size)  # = s_ij, seen from j's side
            out = out - stream if j > i else out + stream  # survivor i added +s_ij for j > i, -s_ij for j < i
    return out
