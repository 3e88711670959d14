"""The operator's two environment variables, named apart: ``$LORM_OPERATOR_DIGEST_FILE`` (lorm-server: the file of
the token's digest) and ``$LORM_ADMIN_TOKEN_FILE`` (lorm-admin: the file of the token). Their old names,
``$LORM_OPERATOR_TOKEN_FILE`` and ``$LORM_OPERATOR_TOKEN``, still read, each with a warning naming the new one;
an old name and the new one set to different files is an error, before anything is served. lorm-admin's, against
a served run: ``tests/server/test_operator_commands.py``."""

from __future__ import annotations

import logging

import pytest

from common.infra.environ import renamed_variable
from common.infra.tls import token_digest
from server.main import build_parser as server_parser
from server.main import main as lorm_server
from server.operator import OperatorAuth, operator_from_args

TOKEN = "operator-variables-0123456789"
DIGEST_NEW, DIGEST_OLD = "LORM_OPERATOR_DIGEST_FILE", "LORM_OPERATOR_TOKEN_FILE"
TOKEN_NEW, TOKEN_OLD = "LORM_ADMIN_TOKEN_FILE", "LORM_OPERATOR_TOKEN"  # lorm-admin's


@pytest.fixture(autouse=True)
def no_operator_variables(monkeypatch):
    for name in (DIGEST_NEW, DIGEST_OLD, TOKEN_NEW, TOKEN_OLD):
        monkeypatch.delenv(name, raising=False)


@pytest.fixture
def files(tmp_path):
    """The operator's token and its digest, as ``lorm-admin token`` writes them, and a second pair."""
    out = {}
    for name, token in (("operator", TOKEN), ("other", "another-operator-token")):
        (tmp_path / f"{name}.token").write_text(token + "\n")
        (tmp_path / f"{name}.token.sha256").write_text(token_digest(token) + "\n")
        out[name] = tmp_path / f"{name}.token"
    return out


def test_no_old_name_is_a_new_name():
    assert not {DIGEST_NEW, TOKEN_NEW} & {DIGEST_OLD, TOKEN_OLD}


def test_a_renamed_variable_reads_the_new_name_then_the_old_with_a_warning_and_refuses_two_values():
    assert renamed_variable("NEW", "OLD", {}) == ("", "")
    assert renamed_variable("NEW", "OLD", {"NEW": "a"}) == ("a", "")
    value, warning = renamed_variable("NEW", "OLD", {"OLD": "a"})
    assert value == "a" and "$OLD is the old name of $NEW" in warning
    assert renamed_variable("NEW", "OLD", {"NEW": "a", "OLD": "a"})[0] == "a"
    with pytest.raises(ValueError, match=r"\$NEW='a' and \$OLD='b' differ"):
        renamed_variable("NEW", "OLD", {"NEW": "a", "OLD": "b"})


def server_operator(*argv: str) -> OperatorAuth | None:
    return operator_from_args(server_parser().parse_args(["--state-dir", "unused", *argv]))


def test_lorm_server_reads_the_digest_file_from_its_new_name_and_its_old_one_with_a_warning(files, monkeypatch, caplog):
    digest, other = f"{files['operator']}.sha256", f"{files['other']}.sha256"
    assert server_operator() is None
    monkeypatch.setenv(DIGEST_NEW, digest)
    with caplog.at_level(logging.WARNING, logger="lorm.server.operator"):
        assert server_operator() == OperatorAuth(token_digest(TOKEN))
    assert not caplog.records

    monkeypatch.delenv(DIGEST_NEW)
    monkeypatch.setenv(DIGEST_OLD, digest)
    with caplog.at_level(logging.WARNING, logger="lorm.server.operator"):
        assert server_operator() == OperatorAuth(token_digest(TOKEN))
    assert [r.getMessage() for r in caplog.records] == [
        f"${DIGEST_OLD} is the old name of ${DIGEST_NEW}: set ${DIGEST_NEW} instead (${DIGEST_OLD} is read for now)"
    ]
    monkeypatch.setenv(DIGEST_NEW, other)
    with pytest.raises(ValueError, match=f"differ: \\${DIGEST_OLD} is the old name of \\${DIGEST_NEW}"):
        server_operator()
    assert server_operator("--operator-digest-file", other) == OperatorAuth(token_digest("another-operator-token"))


def test_lorm_servers_flag_is_named_for_the_digest_and_its_old_name_is_read_with_a_warning(files, caplog):
    """lorm-admin's --operator-token-file is the token; lorm-server's flag for the digest is --operator-digest-file.
    The server's old name for it still reads, with a warning, and both naming different files is refused."""
    digest, other = f"{files['operator']}.sha256", f"{files['other']}.sha256"
    with caplog.at_level(logging.WARNING, logger="lorm.server.operator"):
        assert server_operator("--operator-digest-file", digest) == OperatorAuth(token_digest(TOKEN))
        assert not caplog.records
        assert server_operator("--operator-token-file", digest) == OperatorAuth(token_digest(TOKEN))
    assert [r.getMessage() for r in caplog.records] == [
        "lorm-server --operator-token-file is now --operator-digest-file (the token's digest); the old name is still "
        "read"
    ]
    assert server_operator("--operator-token-file", digest, "--operator-digest-file", digest) is not None
    with pytest.raises(ValueError, match="name different files: give --operator-digest-file only"):
        server_operator("--operator-token-file", other, "--operator-digest-file", digest)


def test_lorm_server_refuses_the_two_names_set_apart_before_it_serves(files, tmp_path, monkeypatch, capsys):
    root = logging.getLogger()  # lorm-server routes the process's logs to its stdout: put them back after it
    monkeypatch.setattr(root, "handlers", list(root.handlers))
    monkeypatch.setattr(root, "level", root.level)
    monkeypatch.setenv(DIGEST_NEW, f"{files['operator']}.sha256")
    monkeypatch.setenv(DIGEST_OLD, f"{files['other']}.sha256")
    port_file = tmp_path / "port"
    argv = ["--preset", "tiny", "--state-dir", str(tmp_path / "state"), "--insecure", "--port", "0"]
    with pytest.raises(SystemExit) as exit_:
        lorm_server([*argv, "--port-file", str(port_file)])
    assert exit_.value.code == 2 and not port_file.exists()  # never served
    assert f"${DIGEST_NEW}=" in capsys.readouterr().err
