"""``lorm-client --sessions N``: each hosted client's flags are its own (index, id, certificate, key, token, ledger)."""

from __future__ import annotations

from pathlib import Path

import pytest

from client.arguments import client_parser
from client.host import hosted_args


def parse(*argv: str):
    return client_parser().parse_args(["--server", "127.0.0.1:1", *argv])


def test_each_hosted_client_gets_its_index_id_and_files():
    args = parse(
        *("--client-id", "site", "--index", "10", "--sessions", "3"),
        *("--tls-cert", "certs/{client_id}.crt", "--tls-key", "certs/{client_id}.key"),
        *("--privacy-ledger", "ledgers/{client_id}.json"),
    )
    third = hosted_args(args, 2)
    assert (third.index, third.client_id, third.sessions) == (12, "site-12", 1)
    assert (third.tls_cert, third.tls_key) == ("certs/site-12.crt", "certs/site-12.key")
    assert third.privacy_ledger == Path("ledgers/site-12.json")
    assert args.index == 10 and args.tls_cert == "certs/{client_id}.crt"  # the process's own flags are left as given


@pytest.mark.parametrize("flag", ["--tls-cert", "--token-file", "--privacy-ledger"])
def test_a_file_every_hosted_client_would_share_is_refused(flag):
    """One certificate, token or ledger for all would make them one identity, or one account of two sites' records."""
    args = parse("--index", "0", "--sessions", "2", flag, "shared.pem")
    with pytest.raises(ValueError, match=f"{flag} shared.pem would be every hosted client's"):
        hosted_args(args, 0)


def test_hosting_needs_a_first_index():
    with pytest.raises(ValueError, match="--sessions needs --index"):
        hosted_args(parse("--sessions", "2"), 0)
