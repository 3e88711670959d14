"""``lorm-launch``: one coordinator and N clients as separate OS processes on loopback.

Writes the run's model spec with ``lorm-spec`` (so the coordinator, started with ``--model-spec``,
holds every client's Describe to it), starts ``lorm-server`` on a free port, then ``num_clients``
``lorm-client`` processes, prints
their output with a prefix per process, and waits for the run to finish. Connections are
mutual TLS with a development CA made for the run (``<run dir>/tls``, ``server/certs.py``);
``--insecure`` runs them in plaintext instead.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO, TextIO

from common.infra.tls import ENV
from common.methods.checks import validate
from common.run.arguments import add_config_arguments, config_from_args
from common.run.config import RunConfig
from server.certs import create_dev_pki

SERVER = [sys.executable, "-m", "server.main"]
CLIENT = [sys.executable, "-m", "client.main"]
SPEC = [sys.executable, "-m", "client.spec"]


def _pump(prefix: str, stream: IO[str], sink: TextIO) -> None:
    for line in iter(stream.readline, ""):
        sink.write(f"[{prefix}] {line}" if prefix else line)
        sink.flush()


ROOT = Path(__file__).resolve().parent.parent


def project_pythonpath() -> str:
    """A child's ``PYTHONPATH``: this checkout's root first, then this process's own ``PYTHONPATH``, if
    any (the packages of an environment that installs them there; no empty entry when it is unset)."""
    inherited = os.environ.get("PYTHONPATH", "")
    return os.pathsep.join([str(ROOT), inherited]) if inherited else str(ROOT)


def _spawn(cmd: list[str], prefix: str, env: dict, quiet: bool) -> subprocess.Popen:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, bufsize=1)
    sink = open(os.devnull, "w") if quiet else sys.stdout
    threading.Thread(target=_pump, args=(prefix, proc.stdout, sink), daemon=True).start()
    return proc


def _security_args(run_dir: Path, num_clients: int, insecure: bool) -> tuple[list[str], list[list[str]]]:
    """Flags for the coordinator and for each client: mTLS with a fresh development CA, or plaintext."""
    if insecure:
        return ["--insecure"], [["--insecure"]] * num_clients
    ids = [f"client-{i}" for i in range(num_clients)]
    pki = create_dev_pki(run_dir / "tls", ids, force=True)  # the run's own CA: replaced on every launch
    server = ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.server_cert), "--tls-key", str(pki.server_key)]
    server += ["--allowed-clients", ",".join(ids)]
    return server, [
        ["--tls-ca", str(pki.ca), "--tls-cert", str(pki.client_cert(c)), "--tls-key", str(pki.client_key(c))]
        for c in ids
    ]


def launch(
    config_path: Path,
    num_clients: int,
    state_dir: Path,
    results_dir: Path,
    timeout_s: float,
    quiet_clients: bool = False,
    extra_server_args: list[str] | None = None,
    insecure: bool = False,
) -> int:
    env = {
        **{k: v for k, v in os.environ.items() if k not in ENV.values()},  # the flags below say it all
        "PYTHONPATH": project_pythonpath(),
        "PYTHONUNBUFFERED": "1",
    }
    server_security, client_security = _security_args(state_dir.parent, num_clients, insecure)
    from client.local import split  # the launcher plays both parties (engine: above client and server)

    # The coordinator's configuration names no client's files; each client gets its own by its flags.
    shared, local = split(validate(RunConfig.from_json(config_path.read_text())))
    coordinator_config = state_dir.parent / "coordinator.json"
    coordinator_config.write_text(shared.to_json())
    extra = list(extra_server_args or [])
    if "--model-spec" not in extra:
        # The model is the launcher's, not the first client's: lorm-spec writes what every client of
        # this configuration describes, and the coordinator holds each Describe to it.
        spec_path = state_dir.parent / "spec.json"
        made = subprocess.run(
            SPEC + ["--config", str(config_path), "--out", str(spec_path)], env=env, capture_output=True, text=True
        )
        if made.returncode != 0:
            print(f"lorm-launch: lorm-spec failed ({made.returncode}):\n{made.stderr[-3000:]}", file=sys.stderr)
            return made.returncode
        extra += ["--model-spec", str(spec_path)]
    port_file = state_dir.parent / "port"
    port_file.unlink(missing_ok=True)
    server = _spawn(
        SERVER
        + [
            "--config",
            str(coordinator_config),
            "--state-dir",
            str(state_dir),
            "--results-dir",
            str(results_dir),
            "--port",
            "0",
            "--port-file",
            str(port_file),
        ]
        + server_security
        + extra,
        "",
        env,
        False,
    )
    clients: list[subprocess.Popen] = []
    try:
        deadline = time.monotonic() + 120
        while not port_file.exists():
            if server.poll() is not None:
                print(f"lorm-launch: the coordinator exited with {server.returncode} before serving", file=sys.stderr)
                return server.returncode or 1
            if time.monotonic() > deadline:
                print("lorm-launch: the coordinator did not start serving within 120 s", file=sys.stderr)
                return 1
            time.sleep(0.05)
        target = f"127.0.0.1:{port_file.read_text().strip()}"
        for i in range(num_clients):
            clients.append(
                _spawn(
                    CLIENT
                    + ["--server", target, "--client-id", f"client-{i}", "--index", str(i)]
                    + local.for_client(i).args()
                    + client_security[i],
                    f"client-{i}",
                    env,
                    quiet_clients,
                )
            )
        try:
            rc = server.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            print(f"lorm-launch: the run did not finish within {timeout_s:.0f} s", file=sys.stderr)
            return 1
        failed = []
        for i, proc in enumerate(clients):
            try:
                if proc.wait(timeout=30) != 0:
                    failed.append(i)
            except subprocess.TimeoutExpired:
                failed.append(i)
        if failed:
            print(f"lorm-launch: clients {failed} did not exit cleanly", file=sys.stderr)
            return rc or 1
        return rc
    finally:
        for proc in clients + [server]:
            if proc.poll() is None:
                proc.kill()
                proc.wait()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="lorm-launch", description="Run a coordinator and its clients locally.")
    add_config_arguments(parser)
    parser.add_argument("--run-dir", default="", help="state and results go here (default runs/<run_id>-<time>)")
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds the whole run may take")
    parser.add_argument("--quiet-clients", action="store_true", help="show only the coordinator's output")
    parser.add_argument(
        "--insecure",
        action="store_true",
        help="plaintext connections instead of mutual TLS with a development CA made for the run",
    )
    args = parser.parse_args(argv)
    config = validate(config_from_args(args))  # a section its method does not read: the coordinator's log warns
    run_dir = Path(args.run_dir or f"runs/{config.run_id}-{time.strftime('%Y%m%d-%H%M%S')}")
    run_dir.mkdir(parents=True, exist_ok=True)
    config_path = run_dir / "config.json"
    config_path.write_text(config.to_json())
    print(f"lorm-launch: run {config.run_id}, {config.num_clients} clients, directory {run_dir}", flush=True)
    return launch(
        config_path,
        config.num_clients,
        run_dir / "state",
        run_dir / "results",
        args.timeout,
        args.quiet_clients,
        insecure=args.insecure,
    )


if __name__ == "__main__":
    sys.exit(main())
