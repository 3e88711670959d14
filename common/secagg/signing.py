"""Signatures for secure aggregation against a malicious coordinator (Bonawitz et al. 2017, §6).

An actively malicious coordinator can swap a client's advertised keys for its own (and so read
the shares sealed to that client), or tell different clients different survivor sets (and so
collect shares of both secrets of one client). §6 stops both with signatures: each client signs
its advertised keys, and in a consistency round signs the survivor set it was told; every
client checks every signature it relies on. Here the signing identity is the client's mTLS
certificate from the run's CA (``server/certs.py``), so no extra PKI is needed:

- :class:`Signer`: a client's certificate and private key; ``sign(message)`` (ECDSA P-256 with
  SHA-256, DER; Ed25519; RSA-PSS with SHA-256 for RSA keys of at least 2048 bits).
- :class:`Verifier`: the run's CA; ``identity(certificate)`` checks the certificate is a client
  certificate of that CA and returns its client id, ``verify(certificate, message, signature)``
  also checks the signature. Every failure is a :class:`~common.secagg.primitives.SecAggError` naming it.
- The only byte strings a client signs, and their format: ``signed_messages.py``.

Certificates, signatures and the fields they cover arrive through the coordinator, so sizes are
bounded before anything is parsed.
"""

from __future__ import annotations

import datetime as dt
import os
import struct
import time
from pathlib import Path
from typing import TypeVar

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from common.infra.tls import CLIENT_URI_SCHEME
from common.secagg.primitives import SecAggError
from common.secagg.signed_messages import HEADER, KEYS, PREFIX, SURVIVORS

MAX_CERTIFICATE_BYTES = 16 * 1024  # a P-256 client certificate in PEM is under 1 KiB
MAX_SIGNATURE_BYTES = 512  # RSA-4096 (512 bytes); ECDSA P-256 DER is at most 72, Ed25519 64
MIN_RSA_BITS = 2048
MIN_EC_BITS = 224  # the security of RSA-2048 (112 bits); refuses P-192 and the 163-bit binary curves
RECHECK_S = 60.0  # a certificate checked against the CA is taken again unchecked for this long
MAX_CHECKED = 4096  # certificates remembered as checked (then forgotten at once)
_E = TypeVar("_E", bound=x509.ExtensionType)
_PSS = padding.PSS(mgf=padding.MGF1(hashes.SHA256()), salt_length=padding.PSS.DIGEST_LENGTH)
# cryptography >= 45 validates client certificates itself (RFC 5280 path validation) under an extension
# policy we can relax to allow CN-only certificates, as the coordinator's TLS does; older ones: the named checks only.
_PATH_VALIDATION = hasattr(verification.PolicyBuilder, "extension_policies")


# ---------------------------------------------------------------- keys and certificates


def _check_key(key: object, whose: str) -> None:
    """Refuse key types and sizes this module does not sign with (public or private halves)."""
    if isinstance(key, (ec.EllipticCurvePrivateKey, ec.EllipticCurvePublicKey)):
        if key.curve.key_size < MIN_EC_BITS:
            raise SecAggError(
                f"{whose}: an EC key on {key.curve.name} is too weak, expected at least {MIN_EC_BITS} bits"
            )
    elif isinstance(key, (rsa.RSAPrivateKey, rsa.RSAPublicKey)):
        if key.key_size < MIN_RSA_BITS:
            raise SecAggError(
                f"{whose}: an RSA key of {key.key_size} bits is too weak, expected at least {MIN_RSA_BITS}"
            )
    elif not isinstance(key, (ed25519.Ed25519PrivateKey, ed25519.Ed25519PublicKey)):
        raise SecAggError(
            f"{whose}: a {type(key).__name__} cannot sign here, expected an EC (e.g. P-256), Ed25519 "
            f"or RSA (at least {MIN_RSA_BITS} bits) key"
        )


def _bounded(data: bytes, limit: int, what: str) -> None:
    if not isinstance(data, bytes):
        raise SecAggError(f"{what}: expected bytes, got {type(data).__name__}")
    if not 0 < len(data) <= limit:
        raise SecAggError(f"{what}: expected 1 to {limit} bytes, got {len(data)}")


def _load_certificate(pem: bytes, what: str) -> x509.Certificate:
    """Exactly one PEM certificate of at most :data:`MAX_CERTIFICATE_BYTES` (checked before parsing)."""
    _bounded(pem, MAX_CERTIFICATE_BYTES, what)
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as err:
        raise SecAggError(f"{what}: not a PEM certificate ({err})") from err
    if len(certs) != 1:
        raise SecAggError(f"{what}: expected exactly one certificate, got {len(certs)}")
    return certs[0]


def client_identity(cert: x509.Certificate) -> str | None:
    """The client id in ``cert``: its ``lorm-client://<id>`` SAN URI, else its one CN; ``None`` if neither.

    The rule of ``server.auth.certificate_identity`` on the names gRPC reports (it lists DNS,
    e-mail and URI SANs together): a certificate naming several clients identifies none of them.
    """
    sans = _extension(cert, x509.SubjectAlternativeName)
    kinds = (x509.DNSName, x509.RFC822Name, x509.UniformResourceIdentifier)
    names = [str(v) for kind in kinds for v in sans.get_values_for_type(kind)] if sans else []
    uris = {n[len(CLIENT_URI_SCHEME) :] for n in names if n.startswith(CLIENT_URI_SCHEME)}
    if len(uris) > 1:
        return None
    if uris:
        return uris.pop() or None
    cns = cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME)
    return cns[0].value if len(cns) == 1 and isinstance(cns[0].value, str) and cns[0].value else None


def _identity_or_refuse(cert: x509.Certificate, who: str) -> str:
    identity = client_identity(cert)
    if identity is None:
        raise SecAggError(
            f"{who} identifies no client: expected one SAN URI {CLIENT_URI_SCHEME}<client_id> (or one CN), "
            "and a certificate naming several clients identifies none"
        )
    return identity


def _extension(cert: x509.Certificate, kind: type[_E]) -> _E | None:
    try:
        return cert.extensions.get_extension_for_class(kind).value
    except x509.ExtensionNotFound:
        return None


def _who(cert: x509.Certificate) -> str:
    return f"certificate {cert.subject.rfc4514_string()[:120]!r}"


# ---------------------------------------------------------------- signer and verifier


def _describe(message: bytes) -> str:
    """``a keys message`` for a message of ``signed_messages.py`` (the kind read back), else its length."""
    if message.startswith(PREFIX) and len(message) >= len(PREFIX) + 4:
        (size,) = struct.unpack_from(">I", message, len(PREFIX))
        kind = message[len(PREFIX) + 4 : len(PREFIX) + 4 + size]
        if kind in (KEYS.encode(), SURVIVORS.encode(), HEADER.encode()):
            return f"a {kind.decode()} message"
    return f"a message of {len(message)} bytes"


class Signer:
    """A client's signing identity: its mTLS certificate and private key (PEM, as ``lorm-certs`` writes them)."""

    def __init__(self, certificate: bytes, private_key: bytes) -> None:
        cert = _load_certificate(certificate, "the signer's certificate")
        try:
            key = serialization.load_pem_private_key(private_key, password=None)
        except (ValueError, TypeError, UnsupportedAlgorithm) as err:
            raise SecAggError(f"the signer's private key: expected an unencrypted PEM private key ({err})") from err
        _check_key(key, "the signer's private key")
        spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
        if key.public_key().public_bytes(*spki) != cert.public_key().public_bytes(*spki):
            raise SecAggError(f"the signer's private key does not belong to its {_who(cert)}")
        self.identity = _identity_or_refuse(cert, f"the signer's {_who(cert)}")
        self.certificate = cert.public_bytes(serialization.Encoding.PEM)
        self._key = key

    @classmethod
    def from_files(cls, cert_path: str | os.PathLike[str], key_path: str | os.PathLike[str]) -> Signer:
        return cls(Path(cert_path).read_bytes(), Path(key_path).read_bytes())

    def sign(self, message: bytes) -> bytes:
        """The signature of ``message``: ECDSA-SHA256 (DER), Ed25519, or RSA-PSS-SHA256, by key type."""
        key = self._key
        if isinstance(key, ec.EllipticCurvePrivateKey):
            return key.sign(message, ec.ECDSA(hashes.SHA256()))
        if isinstance(key, rsa.RSAPrivateKey):
            return key.sign(message, _PSS, hashes.SHA256())
        assert isinstance(key, ed25519.Ed25519PrivateKey), type(key)
        return key.sign(message)


def _check_signature(key: object, signature: bytes, message: bytes) -> None:
    """Raise ``InvalidSignature`` unless ``signature`` is ``key``'s over ``message`` (as :meth:`Signer.sign`)."""
    if isinstance(key, ec.EllipticCurvePublicKey):
        key.verify(signature, message, ec.ECDSA(hashes.SHA256()))
    elif isinstance(key, rsa.RSAPublicKey):
        key.verify(signature, message, _PSS, hashes.SHA256())
    else:
        assert isinstance(key, ed25519.Ed25519PublicKey), type(key)
        key.verify(signature, message)


class Verifier:
    """The run's CA (one or more PEM certificates, as bytes or a path): who signed, and did they."""

    def __init__(self, ca: bytes | str | os.PathLike[str]) -> None:
        pem = ca if isinstance(ca, bytes) else Path(ca).read_bytes()
        try:
            self.cas = x509.load_pem_x509_certificates(pem)
        except ValueError as err:
            raise SecAggError(f"the run's CA: expected PEM certificates ({err})") from err
        for ca_cert in self.cas:
            if not _is_ca(ca_cert):
                raise SecAggError(f"the run's CA: {_who(ca_cert)} is not a CA (basicConstraints cA is not set)")
        # certificate PEM -> (when checked, the certificate, its identity): a step checks the same roster's
        # certificates thousands of times (every box and answer in the signed mode), path validation each time
        self._checked: dict[bytes, tuple[float, x509.Certificate, str]] = {}

    def identity(self, certificate_pem: bytes) -> str:
        """The client id of a certificate the run's CA issued to a client; ``SecAggError`` naming what failed."""
        return self._verified(certificate_pem)[1]

    def verify(self, certificate_pem: bytes, message: bytes, signature: bytes) -> str:
        """The client id of ``certificate_pem`` once it and its ``signature`` over ``message`` check out."""
        _bounded(signature, MAX_SIGNATURE_BYTES, "a signature")
        cert, identity = self._verified(certificate_pem)
        try:
            _check_signature(cert.public_key(), signature, message)
        except (InvalidSignature, ValueError) as err:
            raise SecAggError(
                f"the signature of {identity!r} over {_describe(message)} does not verify: the message was "
                "changed, or the signature or certificate belongs to someone else"
            ) from err
        return identity

    def _verified(self, certificate_pem: bytes) -> tuple[x509.Certificate, str]:
        """The certificate and its identity once it checks out; a certificate that did is taken again without the
        checks for :data:`RECHECK_S` (so one that expires may be taken that much longer)."""
        checked = self._checked.get(certificate_pem)
        if checked is not None and time.monotonic() - checked[0] < RECHECK_S:
            return checked[1], checked[2]
        cert, identity = self._check(certificate_pem)
        if len(self._checked) >= MAX_CHECKED:
            self._checked.clear()
        self._checked[certificate_pem] = (time.monotonic(), cert, identity)
        return cert, identity

    def _check(self, certificate_pem: bytes) -> tuple[x509.Certificate, str]:
        cert = _load_certificate(certificate_pem, "a client certificate")
        who, now = _who(cert), dt.datetime.now(dt.timezone.utc)
        ca = self._issuer(cert, who)  # a certificate the coordinator made itself, or from another run
        for c, whose in ((cert, who), (ca, f"the CA that issued {who}")):
            if not c.not_valid_before_utc <= now <= c.not_valid_after_utc:  # an expired key may have leaked since
                raise SecAggError(
                    f"{whose} is valid from {c.not_valid_before_utc:%Y-%m-%d %H:%M:%S} to "
                    f"{c.not_valid_after_utc:%Y-%m-%d %H:%M:%S} UTC, not now ({now:%Y-%m-%d %H:%M:%S})"
                )
        _check_client_purpose(cert, who)
        _check_key(cert.public_key(), who)
        if _PATH_VALIDATION:  # the library's full RFC 5280 profile as well, e.g. unknown critical extensions
            try:
                _client_verifier(self.cas, now).verify(cert, [])
            except verification.VerificationError as err:
                raise SecAggError(f"{who}: path validation to the run's CA failed: {err}") from err
        return cert, _identity_or_refuse(cert, who)

    def _issuer(self, cert: x509.Certificate, who: str) -> x509.Certificate:
        named = [ca for ca in self.cas if ca.subject == cert.issuer]
        if not named:
            raise SecAggError(
                f"{who} was issued by {cert.issuer.rfc4514_string()[:120]!r}, not by the run's CA "
                f"({', '.join(repr(ca.subject.rfc4514_string()) for ca in self.cas)})"
            )
        for ca in named:
            try:
                cert.verify_directly_issued_by(ca)
                return ca
            except (InvalidSignature, ValueError, TypeError):
                continue
        raise SecAggError(
            f"{who}: its signature does not verify with the key of the run's CA of that name "
            "(forged, or issued by another CA with the same name)"
        )


def certificate_identity(certificate_pem: bytes) -> str:
    """The client id of ``certificate_pem`` once it is valid now, a client's (not a CA, for signatures and
    client authentication) and its key strong enough; ``SecAggError`` naming what failed. Not checked: that
    the run's CA issued it (:meth:`Verifier.identity` checks that too).

    With :func:`check_signature`, what the coordinator checks of a signed advertise when it holds no verifier
    of the run's CA: a forged or replayed advertise (the signature covers the step's context) is refused
    before it reaches any client."""
    cert = _load_certificate(certificate_pem, "a client certificate")
    who, now = _who(cert), dt.datetime.now(dt.timezone.utc)
    if not cert.not_valid_before_utc <= now <= cert.not_valid_after_utc:
        raise SecAggError(f"{who} is not valid now ({now:%Y-%m-%d %H:%M:%S} UTC)")
    _check_client_purpose(cert, who)
    _check_key(cert.public_key(), who)
    return _identity_or_refuse(cert, who)


def check_signature(certificate_pem: bytes, message: bytes, signature: bytes) -> None:
    """``SecAggError`` unless ``signature`` over ``message`` verifies under ``certificate_pem``'s own key."""
    _bounded(signature, MAX_SIGNATURE_BYTES, "a signature")
    cert = _load_certificate(certificate_pem, "a client certificate")
    _check_key(cert.public_key(), _who(cert))
    try:
        _check_signature(cert.public_key(), signature, message)
    except (InvalidSignature, ValueError) as err:
        raise SecAggError(
            f"the signature of {_who(cert)} over {_describe(message)} does not verify: the message was changed "
            "(another step's, another index's, other keys) or the signature is someone else's"
        ) from err


def _client_verifier(cas: list[x509.Certificate], now: dt.datetime) -> verification.ClientVerifier:
    """The library's client verifier for ``cas`` at ``now``, its web-PKI profile but for the SAN, which a
    client certificate may lack (its identity is then its CN, as for the coordinator's TLS)."""
    ee = verification.ExtensionPolicy.webpki_defaults_ee().may_be_present(
        x509.SubjectAlternativeName, verification.Criticality.AGNOSTIC, None
    )
    return (
        verification.PolicyBuilder()
        .store(verification.Store(cas))
        .time(now)
        .extension_policies(ca_policy=verification.ExtensionPolicy.webpki_defaults_ca(), ee_policy=ee)
        .build_client_verifier()
    )


def _is_ca(cert: x509.Certificate) -> bool:
    constraints = _extension(cert, x509.BasicConstraints)
    return constraints is not None and constraints.ca


def _check_client_purpose(cert: x509.Certificate, who: str) -> None:
    """A client's end-entity certificate: not a CA, usable for signatures, and for client authentication."""
    if _is_ca(cert):  # a CA's key must not speak for a client, nor a client certificate issue others
        raise SecAggError(f"{who} is a CA certificate (basicConstraints cA), not a client's")
    usage = _extension(cert, x509.KeyUsage)
    if usage is not None and not usage.digital_signature:
        raise SecAggError(f"{who}: its key usage does not include digitalSignature")
    purposes = _extension(cert, x509.ExtendedKeyUsage)
    if purposes is not None and ExtendedKeyUsageOID.CLIENT_AUTH not in purposes:  # e.g. the coordinator's
        raise SecAggError(
            f"{who}: its extended key usage ({', '.join(p.dotted_string for p in purposes)}) lacks clientAuth"
        )
