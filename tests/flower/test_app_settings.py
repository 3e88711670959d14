"""The ServerApp's settings from Flower's run config: what it refuses at start, before any node is sent a message."""

from __future__ import annotations

import pytest

pytest.importorskip("flwr")

from flower.server_app import RunRefused, settings  # noqa: E402


def test_an_operator_address_without_tls_is_refused_unless_plaintext_is_asked_for() -> None:
    with pytest.raises(RunRefused, match="operator-tls-cert and operator-tls-key"):
        settings({"lorm-args": "--preset tiny", "operator-address": "127.0.0.1:9300"})
    plain = settings({"lorm-args": "--preset tiny", "operator-address": "127.0.0.1:9300", "operator-insecure": True})
    assert plain.operator_security.insecure and plain.operator_address == "127.0.0.1:9300"


def test_plaintext_and_a_certificate_for_the_operator_contradict_each_other() -> None:
    with pytest.raises(RunRefused, match="contradicts"):
        settings({"lorm-args": "--preset tiny", "operator-insecure": "true", "operator-tls-cert": "c.pem"})


def test_a_switch_spelled_otherwise_is_refused_naming_it() -> None:
    with pytest.raises(RunRefused, match="'maybe' is not a switch"):
        settings({"lorm-args": "--preset tiny", "operator-insecure": "maybe"})


def test_lorm_args_that_are_no_configuration_are_refused_naming_them() -> None:
    with pytest.raises(RunRefused, match="lorm-args"):
        settings({"lorm-args": "--preset no-such-preset"})
