"""Real processes on loopback: a coordinator and clients started as the launcher starts them."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from server.certs import create_dev_pki

from procs import ProjectProc as Proc
from procs import free_port


class Cluster:
    """Start and stop coordinator and client processes for one run directory.

    Connections are mutual TLS with a development CA made in ``<run dir>/tls`` (client ids
    ``client-<i>``, and ``extra_ids`` with certificates but no slot in the run), as ``lorm-launch``
    runs them; ``insecure=True``: plaintext.
    """

    def __init__(
        self, run_dir: Path, config_json: str, insecure: bool = False, extra_ids: tuple[str, ...] = ()
    ) -> None:
        self.run_dir = run_dir
        self.config = run_dir / "config.json"
        self.config.write_text(config_json)
        self.port = free_port()
        self.procs: list[Proc] = []
        self.ids = [f"client-{i}" for i in range(json.loads(config_json)["num_clients"])] + list(extra_ids)
        self.pki = None if insecure else create_dev_pki(run_dir / "tls", self.ids)

    def security_args(self, role: str, i: int = 0) -> list[str]:
        if self.pki is None:
            return ["--insecure"]
        admitted = ["--allowed-clients", ",".join(self.ids)] if role == "server" else []
        cert, key = (
            (self.pki.server_cert, self.pki.server_key)
            if role == "server"
            else (self.pki.client_cert(f"client-{i}"), self.pki.client_key(f"client-{i}"))
        )
        return ["--tls-ca", str(self.pki.ca), "--tls-cert", str(cert), "--tls-key", str(key), *admitted]

    def server(
        self, *extra: str, env: dict[str, str] | None = None, program: tuple[str, ...] = ("-m", "server.main")
    ) -> Proc:
        """``extra``: more flags (e.g. ``--quorum 1``); ``env``: e.g. ``{"LORM_FAULT": "merge.fold:3"}``; ``program``:
        what Python runs with ``lorm-server``'s arguments (a hostile coordinator's script)."""
        p = Proc(
            "server",
            [
                sys.executable,
                *program,
                "--config",
                str(self.config),
                "--state-dir",
                str(self.run_dir / "state"),
                "--results-dir",
                str(self.run_dir / "results"),
                "--port",
                str(self.port),
                "--linger",
                "5",
                *self.security_args("server"),
                *extra,
            ],
            env,
        )
        self.procs.append(p)
        return p

    def client(self, i: int, *extra: str, env: dict[str, str] | None = None) -> Proc:
        p = Proc(
            f"client-{i}",
            [
                sys.executable,
                "-m",
                "client.main",
                "--server",
                f"127.0.0.1:{self.port}",
                "--client-id",
                f"client-{i}",
                "--index",
                str(i),
                "--give-up",
                "120",
                "--privacy-ledger",  # a privately trained run's account: in the test's folder, not the home's
                str(self.run_dir / f"ledger-{i}.json"),
                *self.security_args("client", i),
                *extra,
            ],
            env,
        )
        self.procs.append(p)
        return p

    def hosted(self, first: int, count: int, env: dict[str, str] | None = None) -> Proc:
        """A ``lorm-client --sessions count`` process of clients ``first ..``, each with its own certificate and
        privacy ledger (in the test's folder, not the home's)."""
        assert self.pki is not None
        clients = self.pki.client_cert("client-0").parent
        p = Proc(
            f"host-{first}",
            [
                *(sys.executable, "-m", "client.main", "--server", f"127.0.0.1:{self.port}", "--client-id", "client"),
                *("--index", str(first), "--sessions", str(count), "--give-up", "300"),
                *("--tls-ca", str(self.pki.ca), "--tls-cert", str(clients / "{client_id}.crt")),
                *("--tls-key", str(clients / "{client_id}.key")),
                *("--privacy-ledger", str(self.run_dir / "ledger-{client_id}.json")),
            ],
            env,
        )
        self.procs.append(p)
        return p

    def close(self) -> None:
        for p in self.procs:
            p.kill()


@pytest.fixture
def cluster(tmp_path):
    made: list[Cluster] = []

    def make(config_json: str, name: str = "run", insecure: bool = False, extra_ids: tuple[str, ...] = ()) -> Cluster:
        (tmp_path / name).mkdir()
        c = Cluster(tmp_path / name, config_json, insecure, extra_ids)
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()
