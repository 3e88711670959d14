"""Secure aggregation's signatures against a malicious coordinator (Bonawitz et al. 2017, §6): who may
sign (a client certificate of the run's CA, nothing else), what a signature binds, and messages that
never collide."""

from __future__ import annotations

import datetime as dt
import struct

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given, settings
from hypothesis import strategies as st

import common.secagg.signing as signing
from common.secagg.primitives import SecAggError
from common.secagg.signed_messages import KEYS, PREFIX, SURVIVORS, keys_message, survivors_message
from common.secagg.signing import MAX_CERTIFICATE_BYTES, MAX_SIGNATURE_BYTES, Signer, Verifier
from server.auth import certificate_identity
from server.certs import create_dev_pki

CONTEXT = b"run r1|task 0|round 2|phase train|attempt 0"
KEYS_FIELDS = {
    "context": CONTEXT,
    "index": 3,
    "identity": "c0",
    "cipher_public": bytes(range(32)),
    "mask_public": bytes(range(32, 64)),
    "commitment": b"\x07" * 32,
}
NOW = dt.datetime.now(dt.timezone.utc)


@pytest.fixture(scope="module")
def pki(tmp_path_factory):
    return create_dev_pki(tmp_path_factory.mktemp("run"), ["c0", "c1"])


@pytest.fixture(scope="module")
def ca(pki):
    """The run's CA certificate and private key, to issue hand-made certificates from it."""
    key = serialization.load_pem_private_key((pki.out / "ca.key").read_bytes(), password=None)
    return x509.load_pem_x509_certificate(pki.ca.read_bytes()), key


@pytest.fixture(params=["library", "named-checks-only"])
def checks(request, monkeypatch):
    """Each certificate test twice: with the library's path validation, and with the named checks alone
    (what cryptography < 45 gets), so each check stands on its own."""
    if request.param == "library" and not signing._PATH_VALIDATION:
        pytest.skip("cryptography < 45: no client path validation with a relaxed SAN policy")
    monkeypatch.setattr(signing, "_PATH_VALIDATION", request.param == "library")


def pem(cert: x509.Certificate) -> bytes:
    return cert.public_bytes(serialization.Encoding.PEM)


def key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def issue(
    ca,
    *,
    cn: str = "c9",
    uris: tuple[str, ...] = ("lorm-client://c9",),
    key=None,
    not_before: dt.datetime = NOW - dt.timedelta(minutes=5),
    not_after: dt.datetime = NOW + dt.timedelta(days=1),
    digital_signature: bool = True,
    extra: x509.ExtensionType | None = None,
):
    """A client certificate shaped like ``lorm-certs``' (clientAuth, SAN URIs), signed by ``ca``; and its key."""
    ca_cert, ca_key = ca
    key = key or ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(digital_signature, False, False, False, not digital_signature, False, False, False, False),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
    )
    if uris:
        sans = [x509.UniformResourceIdentifier(u) for u in uris]
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    if extra is not None:
        builder = builder.add_extension(extra, critical=True)
    return builder.sign(ca_key, None if isinstance(ca_key, ed25519.Ed25519PrivateKey) else hashes.SHA256()), key


def parse(message: bytes) -> tuple[bytes, list[bytes]]:
    """The (kind, fields) a message encodes: the inverse of the format, so equal messages mean equal inputs."""
    assert message.startswith(PREFIX)
    rest, fields = message[len(PREFIX) :], []
    while rest:
        (size,) = struct.unpack_from(">I", rest)
        assert len(rest) >= 4 + size
        fields.append(rest[4 : 4 + size])
        rest = rest[4 + size :]
    return fields[0], fields[1:]


# ---------------------------------------------------------------- signatures


def test_a_signature_verifies_and_names_its_signer(pki):
    signer = Signer.from_files(pki.client_cert("c0"), pki.client_key("c0"))
    message = keys_message(**KEYS_FIELDS)
    signature = signer.sign(message)
    assert signer.identity == "c0"
    assert len(signature) <= 72  # ECDSA P-256, DER
    for verifier in (Verifier(pki.ca), Verifier(pki.ca.read_bytes())):
        assert verifier.verify(signer.certificate, message, signature) == "c0"
        assert verifier.identity(signer.certificate) == "c0"


@pytest.mark.parametrize(
    "change",
    [
        {"context": CONTEXT.replace(b"attempt 0", b"attempt 1")},
        {"index": 4},
        {"identity": "c1"},
        {"cipher_public": bytes(range(1, 33))},
        {"mask_public": bytes(32)},
        {"commitment": b"\x07" * 31 + b"\x08"},
    ],
    ids=lambda change: next(iter(change)),
)
def test_a_changed_field_fails(pki, change):
    signer = Signer.from_files(pki.client_cert("c0"), pki.client_key("c0"))
    signature = signer.sign(keys_message(**KEYS_FIELDS))
    with pytest.raises(SecAggError, match=r"the signature of 'c0' over a keys message does not verify"):
        Verifier(pki.ca).verify(signer.certificate, keys_message(**{**KEYS_FIELDS, **change}), signature)


def test_a_signature_is_bound_to_its_signer(pki):
    """A coordinator that pairs one client's signature with another's certificate is caught."""
    c0 = Signer.from_files(pki.client_cert("c0"), pki.client_key("c0"))
    c1 = Signer.from_files(pki.client_cert("c1"), pki.client_key("c1"))
    message = survivors_message(CONTEXT, [0, 1], [2])
    with pytest.raises(SecAggError, match="the signature of 'c1' over a survivors message does not verify"):
        Verifier(pki.ca).verify(c1.certificate, message, c0.sign(message))
    flipped = bytearray(c0.sign(message))
    flipped[-1] ^= 1
    with pytest.raises(SecAggError, match="does not verify"):
        Verifier(pki.ca).verify(c0.certificate, message, bytes(flipped))


@pytest.mark.parametrize(
    "make_key",
    [
        lambda: ec.generate_private_key(ec.SECP384R1()),
        ed25519.Ed25519PrivateKey.generate,
        lambda: rsa.generate_private_key(public_exponent=65537, key_size=2048),
    ],
    ids=["ecdsa-p384", "ed25519", "rsa-pss-2048"],
)
def test_other_key_types_sign_and_verify(pki, ca, make_key, checks):
    cert, key = issue(ca, key=make_key())
    signer = Signer(pem(cert), key_pem(key))
    message = keys_message(**KEYS_FIELDS)
    assert Verifier(pki.ca).verify(signer.certificate, message, signer.sign(message)) == "c9"


def test_weak_foreign_or_mismatched_keys_are_refused(pki, ca):
    weak = rsa.generate_private_key(public_exponent=65537, key_size=1024)
    cert, _ = issue(ca, key=weak)
    with pytest.raises(SecAggError, match="RSA key of 1024 bits is too weak"):
        Signer(pem(cert), key_pem(weak))
    with pytest.raises(SecAggError, match="RSA key of 1024 bits is too weak"):
        Verifier(pki.ca).identity(pem(cert))
    with pytest.raises(SecAggError, match="does not belong to its certificate"):
        Signer(pki.client_cert("c0").read_bytes(), pki.client_key("c1").read_bytes())
    with pytest.raises(SecAggError, match="expected an unencrypted PEM private key"):
        Signer(pki.client_cert("c0").read_bytes(), b"not a key")


# ---------------------------------------------------------------- certificates


def test_a_certificate_from_another_ca_fails(pki, ca, tmp_path, checks):
    """Another run's CA of the very same name: caught by the signature check, not only by the name."""
    foreign = create_dev_pki(tmp_path / "foreign", ["c0"])
    assert x509.load_pem_x509_certificate(foreign.ca.read_bytes()).subject == ca[0].subject
    with pytest.raises(SecAggError, match="does not verify with the key of the run's CA"):
        Verifier(pki.ca).identity(foreign.client_cert("c0").read_bytes())
    other_key = ec.generate_private_key(ec.SECP256R1())
    other = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "coordinator CA")])
    other_ca = (
        x509.CertificateBuilder()
        .subject_name(other)
        .issuer_name(other)
        .public_key(other_key.public_key())
        .serial_number(1)
        .not_valid_before(NOW - dt.timedelta(days=1))
        .not_valid_after(NOW + dt.timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
        .sign(other_key, hashes.SHA256())
    )
    cert, _ = issue((other_ca, other_key))
    with pytest.raises(SecAggError, match="issued by 'CN=coordinator CA', not by the run's CA"):
        Verifier(pki.ca).identity(pem(cert))
    assert Verifier(pki.ca.read_bytes() + pem(other_ca)).identity(pem(cert)) == "c9"  # a bundle trusts both


@pytest.mark.parametrize(
    "window",
    [
        (NOW - dt.timedelta(days=10), NOW - dt.timedelta(days=1)),
        (NOW + dt.timedelta(days=1), NOW + dt.timedelta(days=10)),
    ],
    ids=["expired", "not-yet-valid"],
)
def test_a_certificate_outside_its_validity_fails(pki, ca, window, checks):
    cert, _ = issue(ca, not_before=window[0], not_after=window[1])
    with pytest.raises(SecAggError, match=r"certificate 'CN=c9' is valid from .* UTC, not now"):
        Verifier(pki.ca).identity(pem(cert))


def test_a_ca_certificate_is_no_client(pki, checks):
    with pytest.raises(SecAggError, match="is a CA certificate"):
        Verifier(pki.ca).identity(pki.ca.read_bytes())


def test_the_coordinator_certificate_is_no_client(pki, checks):
    server = x509.load_pem_x509_certificate(pki.server_cert.read_bytes())
    assert list(server.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value) == [
        ExtendedKeyUsageOID.SERVER_AUTH
    ]
    with pytest.raises(SecAggError, match="lacks clientAuth"):
        Verifier(pki.ca).identity(pki.server_cert.read_bytes())


def test_a_key_not_for_signatures_fails(pki, ca, checks):
    cert, _ = issue(ca, digital_signature=False)
    with pytest.raises(SecAggError, match="key usage does not include digitalSignature"):
        Verifier(pki.ca).identity(pem(cert))


@pytest.mark.skipif(
    not signing._PATH_VALIDATION, reason="cryptography < 45: no client path validation with a relaxed SAN policy"
)
def test_the_library_path_validation_runs_too(pki, ca):
    """An unknown critical extension passes every named check but not RFC 5280 path validation."""
    unknown = x509.UnrecognizedExtension(x509.ObjectIdentifier("1.3.6.1.4.1.55555.1"), b"\x05\x00")
    cert, _ = issue(ca, extra=unknown)
    with pytest.raises(SecAggError, match="path validation to the run's CA failed"):
        Verifier(pki.ca).identity(pem(cert))


@pytest.mark.parametrize(
    ("cn", "uris", "expected"),
    [
        ("bob", ("lorm-client://alice", "https://example.org/x"), "alice"),
        ("bob", (), "bob"),
        ("bob", ("https://example.org/x",), "bob"),
        ("c1", ("lorm-client://c1", "lorm-client://c2"), None),
        ("c1", ("lorm-client://",), None),
    ],
)
def test_identity_is_the_san_uri_else_the_common_name(pki, ca, cn, uris, expected, checks):
    cert, key = issue(ca, cn=cn, uris=uris)
    auth_context = {"x509_subject_alternative_name": [u.encode() for u in uris], "x509_common_name": [cn.encode()]}
    assert certificate_identity(auth_context) == expected  # the coordinator's rule for the same certificate
    assert signing.client_identity(cert) == expected
    if expected is None:
        with pytest.raises(SecAggError, match="identifies no client"):
            Verifier(pki.ca).identity(pem(cert))
        with pytest.raises(SecAggError, match="identifies no client"):
            Signer(pem(cert), key_pem(key))
    else:
        assert Verifier(pki.ca).identity(pem(cert)) == expected
        assert Signer(pem(cert), key_pem(key)).identity == expected


def test_oversized_inputs_are_refused_before_parsing(pki, monkeypatch):
    signer = Signer.from_files(pki.client_cert("c0"), pki.client_key("c0"))
    verifier = Verifier(pki.ca)

    def no_parsing(*args):
        raise AssertionError("parsed an input over its size bound")

    monkeypatch.setattr(signing.x509, "load_pem_x509_certificates", no_parsing)
    big = signer.certificate + b"\n" * (MAX_CERTIFICATE_BYTES + 1 - len(signer.certificate))
    with pytest.raises(SecAggError, match=f"expected 1 to {MAX_CERTIFICATE_BYTES} bytes, got {len(big)}"):
        verifier.identity(big)
    with pytest.raises(SecAggError, match=f"a signature: expected 1 to {MAX_SIGNATURE_BYTES} bytes, got 513"):
        verifier.verify(signer.certificate, b"m", b"\x30" * (MAX_SIGNATURE_BYTES + 1))
    with pytest.raises(SecAggError, match="expected 1 to"):
        verifier.verify(signer.certificate, b"m", b"")


def test_one_certificate_per_input(pki):
    two = pki.client_cert("c0").read_bytes() + pki.client_cert("c1").read_bytes()
    with pytest.raises(SecAggError, match="expected exactly one certificate, got 2"):
        Verifier(pki.ca).identity(two)
    with pytest.raises(SecAggError, match="not a PEM certificate"):
        Verifier(pki.ca).identity(b"-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n")
    with pytest.raises(SecAggError, match="is not a CA"):
        Verifier(pki.client_cert("c0"))


# ---------------------------------------------------------------- messages

blobs = st.binary(max_size=40)
indices = st.integers(0, 2**32 - 1)
index_lists = st.lists(indices, max_size=6, unique=True).map(sorted)


@settings(max_examples=200, deadline=None)
@given(blobs, indices, st.text(min_size=1, max_size=10), blobs, blobs, blobs, blobs, index_lists, index_lists)
def test_messages_parse_back_to_their_fields(context, index, identity, cipher, mask, commitment, ctx2, surv, drop):
    """Each message decodes to exactly its kind and fields: equal messages mean equal inputs (no collisions)."""
    assert parse(keys_message(context, index, identity, cipher, mask, commitment)) == (
        KEYS.encode(),
        [context, struct.pack(">I", index), identity.encode(), cipher, mask, commitment],
    )
    drop = [d for d in drop if d not in surv]
    assert parse(survivors_message(ctx2, surv, drop)) == (
        SURVIVORS.encode(),
        [ctx2, b"".join(struct.pack(">I", i) for i in surv), b"".join(struct.pack(">I", i) for i in drop)],
    )


def test_shifted_boundaries_and_kinds_never_collide():
    base = dict(KEYS_FIELDS, context=b"ab", identity="c", cipher_public=b"xy", mask_public=b"z")
    shifted = [
        dict(base, context=b"a", identity="bc"),  # a byte moved from context to identity
        dict(base, cipher_public=b"x", mask_public=b"yz"),
        dict(base, mask_public=b"", commitment=b"z" + base["commitment"]),
    ]
    messages = {keys_message(**fields) for fields in [base, *shifted]}
    messages |= {
        survivors_message(b"ab", [1], [2]),
        survivors_message(b"ab", [1, 2], []),
        survivors_message(b"ab", [], [1, 2]),
    }
    assert len(messages) == 7
    assert survivors_message(b"", [], []) not in {keys_message(b"", 0, "c", b"", b"", b"")}


@pytest.mark.parametrize(
    ("survivors", "dropped", "error"),
    [
        ([2, 1], [], "survivors: expected client indices sorted and without duplicates"),
        ([1, 1], [], "survivors: expected client indices sorted and without duplicates"),
        ([1], [3, 2], "dropped: expected client indices sorted and without duplicates"),
        ([1, 2], [2], r"clients \[2\] are in both lists"),
        ([-1], [], r"expected a client index in \[0, 2\^32\)"),
        ([2**32], [], r"expected a client index in \[0, 2\^32\)"),
    ],
)
def test_survivors_lists_are_refused_unless_sorted_distinct_and_disjoint(survivors, dropped, error):
    with pytest.raises(SecAggError, match=error):
        survivors_message(CONTEXT, survivors, dropped)
