"""deploy/compose-owned.yaml: a run on the clients' own data. The coordinator mounts no data and runs the committed
schedule; each client mounts one data folder, its own; lorm-serve reads the coordinator's results read-only. Every
command is parsed, and checked, by its program's own parser and checks (the helpers here serve
test_owned_k8s.py and test_owned_docs.py too)."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_manifests import DEPLOY, IMAGES, ROOT, dockerfile, env_read_by_code, image_name, instruction, interpolate

from common.infra.tls import security_from_args
from common.run.config import client_local_values
from common.run.schedule import class_schedule, config_with_schedule, head_classes, read_schedule, scheduled_classes
from common.run.settings import DataSettings

NUM_CLIENTS = 3


def load_module(path: Path):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def compose_owned(n: int = NUM_CLIENTS, env: dict[str, str] | None = None) -> dict:
    text = load_module(DEPLOY / "compose_gen.py").compose_owned(n)
    for name, value in (env or {}).items():  # as compose substitutes a variable that is set
        text = re.sub(rf"\$\{{{name}:?-[^}}]*\}}", value, text)
    return yaml.safe_load(interpolate(text))


def localized(argv: list[str], files: dict[str, Path]) -> list[str]:
    """``argv`` with every path in ``files`` (a path in the container -> the file here) replaced."""
    return [str(files[a]) if a in files else a for a in argv]


def placeholders(paths: list[str], root: Path) -> dict[str, Path]:
    """An existing file here for each path a container reads from a secret: the checks need only a file."""
    files = {}
    for path in paths:
        files[path] = root / path.strip("/").replace("/", "_")
        files[path].write_text("placeholder")
    return files


def coordinator_config(argv: list[str]):
    """lorm-server's parse and its checks of the schedule and the configuration, as ``main`` runs them."""
    from server.main import build_parser

    args = build_parser().parse_args(argv)
    security_from_args(args, "server")
    config = config_with_schedule(args)
    assert not client_local_values(config), "the coordinator names a client's own setting: every client refuses it"
    return args, config


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def image_env(image: str) -> dict[str, str]:
    """The LORM_ environment an image sets (its Dockerfile's ENV)."""
    return dict(re.findall(r"\b(LORM_\w+)=(\S+)", " ".join(instruction(dockerfile(IMAGES[image]), "ENV"))))


def client_args(argv: list[str], env: dict[str, str], monkeypatch) -> argparse.Namespace:
    """lorm-client's own parser (built in its ``main``) over ``argv`` with the client image's LORM_ environment
    and ``env`` on top; then its checks of the TLS files and its own data flags."""
    import client.main
    from client.local import local_from_args

    for name in [n for n in os.environ if n.startswith("LORM_")]:
        monkeypatch.delenv(name)
    for name, value in (image_env("lorm-client") | env).items():
        if value is not None:  # compose: a variable without a value is the shell's, unset here
            monkeypatch.setenv(name, str(value))

    def parsed(args: argparse.Namespace, role: str) -> None:
        raise Parsed(args)

    monkeypatch.setattr(client.main, "security_from_args", parsed)
    try:
        client.main.main(argv)
    except Parsed as done:
        args = done.namespace
    except SystemExit as err:
        pytest.fail(f"lorm-client refused {argv}: exit {err.code}")
    security_from_args(args, "client")
    local_from_args(args)
    return args


def serve_args(argv: list[str]) -> argparse.Namespace:
    from serve.main import build_parser
    from serve.main import security_from_args as serve_security

    args = build_parser().parse_args(argv)
    serve_security(args)
    return args


def under(path: str, mount: str) -> bool:
    return path.startswith(mount.rstrip("/") + "/")


def test_owned_compose_is_what_the_generator_writes_and_valid_against_the_specification():
    from compose_spec import PyCompose

    gen = load_module(DEPLOY / "compose_gen.py")
    assert (DEPLOY / "compose-owned.yaml").read_text() == gen.compose_owned(NUM_CLIENTS)
    for n in (1, NUM_CLIENTS):
        parsed = PyCompose.from_json(json.dumps(compose_owned(n)))
        assert parsed.service_names() == ["coordinator", "serve"] + [f"client-{i}" for i in range(n)]
    assert compose_owned()["name"] != yaml.safe_load((DEPLOY / "compose.yaml").read_text())["name"]


def compose_files(service: dict, spec: dict, root: Path) -> dict[str, Path]:
    """A service's mounted files: its configs (the committed files) and its secrets (placeholders)."""
    files = {c["target"]: DEPLOY / spec["configs"][c["source"]]["file"] for c in service.get("configs", [])}
    return files | placeholders([f"/run/secrets/{s['target']}" for s in service.get("secrets", [])], root)


def test_owned_compose_coordinator_has_no_data_and_runs_the_committed_schedule(tmp_path):
    spec = compose_owned()
    coordinator = spec["services"]["coordinator"]
    assert image_name(coordinator["image"]) == "lorm-coordinator"
    assert sorted(coordinator["volumes"]) == ["results:/results", "state:/state"], "the coordinator mounts no data"
    files = compose_files(coordinator, spec, tmp_path)
    args, config = coordinator_config(localized(coordinator["command"], files))
    assert not config.data_dir and config.section(DataSettings).open
    assert class_schedule(config) == read_schedule(DEPLOY / "schedule.txt")
    assert head_classes(config, len(scheduled_classes(read_schedule(DEPLOY / "schedule.txt")))) > 4, "no room to grow"
    assert args.operator_digest_file == str(files["/run/secrets/operator.sha256"])
    assert args.model_spec == str(files["/run/secrets/model-spec.json"])
    assert (args.state_dir, args.results_dir) == ("/state", "/results")
    clients = sorted(n for n in spec["services"] if n.startswith("client-"))
    assert args.allowed_clients.split(",") == clients
    assert f"127.0.0.1:{args.port}" in coordinator["healthcheck"]["test"]


def test_owned_compose_clients_mount_their_own_data_alone(tmp_path, monkeypatch):
    spec = compose_owned()
    clients = {n: s for n, s in spec["services"].items() if n.startswith("client-")}
    assert len(clients) == NUM_CLIENTS
    sources = []
    for name, s in clients.items():
        (mount,) = s["volumes"]  # no model cache or other volume shared with another client
        source, target, mode = mount.split(":")
        assert (target, mode) == ("/data", "ro") and source.startswith("./") and name in source, mount
        sources.append(source)
        assert s["depends_on"]["coordinator"]["condition"] == "service_healthy"
        assert {x["source"] for x in s["secrets"]} == {"ca", f"{name}-cert", f"{name}-key"}, name
        for var in s["environment"]:
            assert env_read_by_code(var), f"{name}: environment {var} is read by no code"
        assert image_name(s["image"]) == "lorm-client" and "entrypoint" not in s
        files = compose_files(s, spec, tmp_path)
        args = client_args(localized(s["command"], files), s["environment"], monkeypatch)
        assert args.client_id == name and args.server == "coordinator:50051"
        assert under(args.data, target) and under(args.test_data, target), (args.data, args.test_data)
        assert not args.train_file and not args.test_file and not args.image_root, "a shard's files"
    assert len(set(sources)) == len(sources), "two clients share a data folder"
    assert not {v.split(":")[0] for s in clients.values() for v in s["volumes"]} & set(spec["volumes"])

    # A client without a test split: its variable set empty, it trains and evaluates nothing.
    quiet = compose_owned(env={"LORM_CLIENT_1_TEST_DATA": ""})["services"]["client-1"]
    files = compose_files(quiet, spec, tmp_path)
    args = client_args(localized(quiet["command"], files), quiet["environment"], monkeypatch)
    assert args.data and not args.test_data


def test_owned_compose_serve_reads_the_coordinators_results_read_only(tmp_path):
    spec = compose_owned()
    serve, coordinator = spec["services"]["serve"], spec["services"]["coordinator"]
    assert image_name(serve["image"]) == "lorm-client" and serve["entrypoint"] == ["lorm-serve"]
    assert re.search(r"^COPY serve ", dockerfile(IMAGES["lorm-client"]), flags=re.M), "the image lacks lorm-serve"
    (mount,) = serve["volumes"]
    volume, target, mode = mount.split(":")
    assert mode == "ro" and f"{volume}:/results" in coordinator["volumes"] and volume in spec["volumes"]
    seen = compose_files(serve, spec, tmp_path)
    args = serve_args(localized(serve["command"], seen))
    assert args.models == target and args.host == "0.0.0.0"
    assert f"{args.port}:{args.port}" in serve["ports"]
    # Its own certificate: the coordinator's key, which clients trust the coordinator by, is not among its files.
    assert (args.tls_cert, args.tls_key) == (str(seen["/run/secrets/serve.crt"]), str(seen["/run/secrets/serve.key"]))
    assert not {x["source"] for x in serve["secrets"]} & {"coordinator-cert", "coordinator-key"}
    assert spec["secrets"]["serve-key"]["file"] == "./certs/serve.key"

    # The health check: GET /health of this server, over mutual TLS with a certificate it admits.
    cmd, python, flag, script = serve["healthcheck"]["test"]
    assert (cmd, python, flag) == ("CMD", "python3", "-c")
    compile(script, "healthcheck", "exec")
    assert f"'https://127.0.0.1:{args.port}/health'" in script
    mounted = {f"/run/secrets/{x['target']}" for x in serve["secrets"]}
    paths = re.findall(r"'(/[^']+)'", script)
    assert paths and set(paths) <= mounted, set(paths) - mounted
    assert "health" in args.allowed_clients.split(",")


def test_serve_healthcheck_reaches_lorm_serve_over_mutual_tls(tmp_path):
    """The compose health check against a real lorm-serve on the service's own flags and development files: the
    handshake, the hostname and the admission of ``health`` pass, and the check fails on the 503 of a server
    without an export (a refused certificate would fail on the connection instead)."""
    from server.certs import create_dev_pki

    pki = create_dev_pki(
        tmp_path / "certs", ["app", "health"], ("coordinator",), serve_hosts=("serve", "localhost", "127.0.0.1")
    )
    serve = compose_owned()["services"]["serve"]
    files = {"ca.crt": pki.ca, "serve.crt": pki.serve_cert, "serve.key": pki.serve_key}
    files |= {"health.crt": pki.client_cert("health"), "health.key": pki.client_key("health")}
    mounted = {f"/run/secrets/{name}": path for name, path in files.items()}
    (tmp_path / "models").mkdir()
    argv = localized(serve["command"], mounted | {"/models": tmp_path / "models"})
    argv[argv.index("--port") + 1] = "0"
    server = subprocess.Popen(
        [sys.executable, "-m", "serve.main", *argv, "--host", "127.0.0.1"],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    try:
        line = ""
        while "listening on" not in line:
            line = server.stdout.readline()
            assert line, "lorm-serve stopped before it listened"
        port = re.search(r":(\d+) ", line).group(1)
        script = serve["healthcheck"]["test"][3]
        for path, local in mounted.items():
            script = script.replace(f"'{path}'", f"'{local}'")
        script = re.sub(r"127\.0\.0\.1:\d+/", f"127.0.0.1:{port}/", script)
        check = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert check.returncode != 0 and "HTTP Error 503" in check.stderr, check.stderr[-500:]


def test_docker_compose_config_of_the_owned_file_when_the_cli_has_compose():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` CLI here")
    out = subprocess.run(
        [docker, "compose", "-f", "compose-owned.yaml", "config", "--quiet", "--no-path-resolution"],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "not found" in out.stderr.lower() or "no such file" in out.stderr.lower():
        pytest.skip(f"docker compose config needs the run's files beside the compose file: {out.stderr[-200:]}")
    assert out.returncode == 0, out.stderr
