"""deploy/compose-owned.yaml and deploy/k8s-owned/: a run on the clients' own data. The coordinator mounts no data
and names its schedule; each client mounts one data volume, its own; lorm-serve reads the coordinator's results
read-only. Every command is parsed, and checked, by its program's own parser and checks."""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from test_manifests import DEPLOY, IMAGES, ROOT, dockerfile, env_read_by_code, exec_uid, image_name, interpolate

from common.infra.tls import security_from_args
from common.run.config import client_local_values, config_from_args
from common.run.schedule import class_schedule, head_classes, read_schedule, schedule_from_args, scheduled_classes
from common.run.settings import DataSettings

OWNED = DEPLOY / "k8s-owned"
SITE = OWNED / "coordinator"
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
    """An existing file here for each TLS path of a container: the checks need only that it is a file."""
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
    config = schedule_from_args(args, config_from_args(args))
    assert not client_local_values(config), "the coordinator names a client's own setting: every client refuses it"
    return args, config


class Parsed(Exception):
    def __init__(self, namespace: argparse.Namespace) -> None:
        self.namespace = namespace


def client_args(argv: list[str], env: dict[str, str], monkeypatch) -> argparse.Namespace:
    """lorm-client's own parser (built in its ``main``) over ``argv`` with ``env`` as its whole LORM_ environment;
    then its checks of the TLS files and its own data flags."""
    import client.main
    from client.local import local_from_args

    for name in [n for n in os.environ if n.startswith("LORM_")]:
        monkeypatch.delenv(name)
    for name, value in env.items():
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


# ------------------------------------------------------------------ compose


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
    assert args.operator_token_file == str(files["/run/secrets/operator.sha256"])
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
        assert not args.data_dir and not args.train_file and not args.test_file and not args.image_root
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
    args = serve_args(localized(serve["command"], compose_files(serve, spec, tmp_path)))
    assert args.models == target and args.host == "0.0.0.0"
    assert f"{args.port}:{args.port}" in serve["ports"]
    assert {x["target"] for x in serve["secrets"]} <= {x["target"] for x in coordinator["secrets"]}

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

    pki = create_dev_pki(tmp_path / "certs", ["app", "health"], ("serve", "localhost", "127.0.0.1"))
    serve = compose_owned()["services"]["serve"]
    files = {"ca.crt": pki.ca, "coordinator.crt": pki.server_cert, "coordinator.key": pki.server_key}
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


# ------------------------------------------------------------------ Kubernetes


def kustomization() -> dict:
    return yaml.safe_load((SITE / "kustomization.yaml").read_text())


def site_objects() -> dict[tuple[str, str], dict]:
    objects = {}
    for resource in kustomization()["resources"]:
        for doc in yaml.safe_load_all((SITE / resource).read_text()):
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def generated() -> dict[str, dict[str, Path]]:
    """ConfigMap or Secret name -> key -> the file it is made from (relative to the kustomization)."""
    out = {}
    k = kustomization()
    for gen in k.get("configMapGenerator", []) + k.get("secretGenerator", []):
        out[gen["name"]] = {
            (e.partition("=")[0] if "=" in e else Path(e).name): SITE / e.rpartition("=")[2] for e in gen["files"]
        }
    return out


def container_files(pod: dict, container: dict, root: Path) -> dict[str, Path]:
    """Every file a container sees through a ConfigMap or Secret: the committed file where there is one (the
    schedule), else a placeholder. Checks that each such volume is one the kustomization generates."""
    volumes, made = {v["name"]: v for v in pod["volumes"]}, generated()
    files: dict[str, Path] = {}
    for m in container["volumeMounts"]:
        v = volumes[m["name"]]
        name = v.get("configMap", {}).get("name") or v.get("secret", {}).get("secretName")
        if name is None:
            continue
        assert name in made, f"{container['name']}: {name} is generated by nothing"
        for key, source in made[name].items():
            path = f"{m['mountPath']}/{key}"
            files |= {path: source} if source.name == "schedule.txt" else placeholders([path], root)
    return files


def test_k8s_site_holds_no_data_and_serve_reads_its_results_read_only(tmp_path):
    objects = site_objects()
    deploy = objects[("Deployment", "lorm-coordinator")]
    pod = deploy["spec"]["template"]["spec"]
    claims = {
        v["name"]: v["persistentVolumeClaim"]["claimName"] for v in pod["volumes"] if "persistentVolumeClaim" in v
    }
    assert claims == {"state": "lorm-state"} and ("PersistentVolumeClaim", "lorm-state") in objects
    assert [k for k in objects if k[0] == "PersistentVolumeClaim"] == [("PersistentVolumeClaim", "lorm-state")]
    containers = {c["name"]: c for c in pod["containers"]}
    assert set(containers) == {"coordinator", "serve"}

    coordinator = containers["coordinator"]
    assert image_name(coordinator["image"]) == "lorm-coordinator"
    args, config = coordinator_config(localized(coordinator["args"], container_files(pod, coordinator, tmp_path)))
    assert not config.data_dir and config.section(DataSettings).open and args.keep_serving
    assert class_schedule(config) == read_schedule(DEPLOY / "schedule.txt")
    assert (SITE / "schedule.txt").read_text() == (DEPLOY / "schedule.txt").read_text()
    (state,) = [m for m in coordinator["volumeMounts"] if m["name"] == "state"]
    assert under(args.results_dir, state["mountPath"]) and not state.get("readOnly")
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert coordinator[probe]["exec"]["command"][:3] == ["lorm-health", "--target", f"127.0.0.1:{args.port}"]

    serve = containers["serve"]
    assert image_name(serve["image"]) == "lorm-client" and serve["command"] == ["lorm-serve"]
    served = serve_args(localized(serve["args"], container_files(pod, serve, tmp_path)))
    (view,) = [m for m in serve["volumeMounts"] if m["name"] == "state"]
    assert view["readOnly"] is True and view["mountPath"] == state["mountPath"]
    assert served.models == args.results_dir
    ports = {p["name"]: p["containerPort"] for p in serve["ports"]}
    assert ports == {"https": served.port}
    # Not GET /health (503 until the first export): a container that is not ready takes the coordinator's
    # gRPC out of its Service too.
    for probe in ("readinessProbe", "livenessProbe"):
        assert serve[probe]["tcpSocket"] == {"port": "https"}, probe
    for c in (coordinator, serve):
        assert c["securityContext"]["readOnlyRootFilesystem"] is True
        assert "/home/lorm" in {m["mountPath"] for m in c["volumeMounts"]}

    labels = deploy["spec"]["template"]["metadata"]["labels"]
    for name, port in (("lorm-coordinator", "grpc"), ("lorm-serve", "https")):
        service = objects[("Service", name)]
        assert service["spec"]["selector"].items() <= labels.items()
        assert port in {p["targetPort"] for p in service["spec"]["ports"]}


def test_k8s_site_renders_with_kustomize(tmp_path):
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("no kubectl here (kubectl kustomize renders offline)")
    site = tmp_path / "coordinator"
    shutil.copytree(SITE, site)
    for files in generated().values():
        for source in files.values():
            made = site / source.relative_to(SITE)
            if not made.exists():  # keys, the operator's digest and the model spec are made per run
                made.parent.mkdir(parents=True, exist_ok=True)
                made.write_text("placeholder\n")
    out = subprocess.run([kubectl, "kustomize", str(site)], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    rendered = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(out.stdout)}
    assert set(site_objects()) | {("ConfigMap", n) for n in ("lorm-schedule", "lorm-model-spec")} | {
        ("Secret", n) for n in ("lorm-coordinator-tls", "lorm-operator")
    } == set(rendered)
    assert all(d["metadata"].get("namespace") == "lorm-owned" for k, d in rendered.items() if k[0] != "Namespace")


def client_gen():
    return load_module(OWNED / "client_gen.py")


def client_objects(text: str) -> dict[str, dict]:
    return {d["kind"]: d for d in yaml.safe_load_all(text)}


def test_k8s_client_example_is_what_the_generator_writes():
    assert (OWNED / "client-0.yaml").read_text() == client_gen().manifest("client-0")
    with pytest.raises(ValueError, match="DNS label"):
        client_gen().manifest("Site_A")


@pytest.mark.parametrize("options", [{}, {"gpus": 1, "test_data": False, "server": "lorm.example.org:443"}])
def test_k8s_clients_each_mount_their_own_claim_and_certificate(options, tmp_path, monkeypatch):
    ids = ["client-0", "client-1", "site-a"]
    texts = {i: client_gen().manifest(i, **options) for i in ids}
    seen: dict[str, set[str]] = {"claim": set(), "secret": set()}
    for client_id, text in texts.items():
        objects = client_objects(text)
        assert set(objects) == {"PersistentVolumeClaim", "Job"}, client_id
        claim = objects["PersistentVolumeClaim"]["metadata"]["name"]
        assert claim == f"lorm-client-{client_id}-data"
        pod = objects["Job"]["spec"]["template"]["spec"]
        assert pod["restartPolicy"] == "OnFailure"
        (container,) = pod["containers"]
        volumes = {v["name"]: v for v in pod["volumes"]}
        claims = [v["persistentVolumeClaim"] for v in volumes.values() if "persistentVolumeClaim" in v]
        assert claims == [{"claimName": claim, "readOnly": True}], "one data claim, its own"
        secrets = [v["secret"]["secretName"] for v in volumes.values() if "secret" in v]
        assert secrets == [f"lorm-client-{client_id}-tls"]
        seen["claim"].add(claim)
        seen["secret"].add(secrets[0])

        # The secret the header's command creates holds the files the arguments name, where they are mounted.
        created = re.search(rf"kubectl create secret generic {secrets[0]} (.+\n#.+)", text).group(1)
        keys = set(re.findall(r"--from-file=([\w.]+)=", created))
        mounts = {m["name"]: m for m in container["volumeMounts"]}
        files = placeholders([f"{mounts['tls']['mountPath']}/{k}" for k in keys], tmp_path)
        env = {e["name"]: e["value"] for e in container["env"]}
        for var in env:
            assert env_read_by_code(var), f"environment {var} is read by no code"
        assert image_name(container["image"]) == "lorm-client"
        args = client_args(localized(container["args"], files), env, monkeypatch)
        assert args.client_id == client_id and args.server == options.get("server", client_gen().DEFAULT_SERVER)
        assert mounts["data"]["readOnly"] is True and under(args.data, mounts["data"]["mountPath"])
        assert bool(args.test_data) == options.get("test_data", True)
        assert not args.test_data or under(args.test_data, mounts["data"]["mountPath"])
        gpus = container["resources"]["limits"].get("nvidia.com/gpu", 0)
        assert gpus == options.get("gpus", 0) and bool(pod.get("tolerations")) == bool(gpus)
        assert pod["securityContext"]["runAsUser"] == exec_uid("lorm-client")
    assert len(seen["claim"]) == len(seen["secret"]) == len(ids), "two clients share a claim or a secret"


def test_k8s_client_default_server_is_the_sites_service():
    objects = site_objects()
    service = objects[("Service", "lorm-coordinator")]
    port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    expected = f"{service['metadata']['name']}.{kustomization()['namespace']}.svc:{port}"
    assert client_gen().DEFAULT_SERVER == expected


# ------------------------------------------------------------------ docs/DEPLOY.md


def doc_commands(section: str) -> list[list[str]]:
    """The shell commands (words, comments dropped) of the ``bash`` blocks of a section of docs/DEPLOY.md."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    assert blocks, section
    return [shlex.split(line, comments=True) for b in blocks for line in b.replace("\\\n", " ").splitlines()]


def named(commands: list[list[str]], program: str) -> list[list[str]]:
    return [c for c in commands if c[0] == program]


def written(commands: list[list[str]]) -> dict[str, Path]:
    """What the commands write with ``>`` (``lorm-spec``: ``--out``), by the program that writes it."""
    out = {}
    for c in commands:
        if ">" in c:
            out[c[0] if c[0] != "printf" else c[c.index(">") - 1]] = ROOT / c[c.index(">") + 1]
    return out


COMPOSE = "Compose with the clients' own data"
KUBERNETES = "Kubernetes with the clients' own data"


def test_the_docs_make_the_files_the_compose_file_reads():
    from server.admin import build_parser as admin_parser
    from server.certs import Pki

    commands, spec = doc_commands(COMPOSE), compose_owned()
    (certs,) = named(commands, "lorm-certs")
    values = dict(zip(certs[1::2], certs[2::2]))
    pki = Pki(ROOT / values["--out"])
    clients = [n for n in spec["services"] if n.startswith("client-")]
    layout = {pki.ca, pki.server_cert, pki.server_key} | {
        f for c in [*clients, "health"] for f in (pki.client_cert(c), pki.client_key(c))
    }
    files = {name: (DEPLOY / s["file"]).resolve() for name, s in spec["secrets"].items()}
    assert {files[n] for n in files if n not in ("operator-digest", "model-spec")} == {p.resolve() for p in layout}
    assert set(values["--clients"].split(",")) == {*clients, "health", "operator", "app"}
    assert {"coordinator", "serve", "127.0.0.1", "localhost"} <= set(values["--hosts"].split(","))

    digests = [c for c in commands if c[:2] == ["printf", "%s"] and "sha256sum" in c]
    assert (
        [ROOT / c[-1] for c in digests]
        == [DEPLOY / "operator.sha256"]
        == [DEPLOY / spec["secrets"]["operator-digest"]["file"]]
    )
    (spec_command,) = named(commands, "lorm-spec")
    assert ROOT / spec_command[spec_command.index("--out") + 1] == DEPLOY / spec["secrets"]["model-spec"]["file"]
    assert {c[3] for c in named(commands, "docker")} == {"deploy/compose-owned.yaml"}

    token = next(ROOT / c[-1] for c in commands if c[:3] == ["printf", "%s", "$TOKEN"] and "sha256sum" not in c)
    port = spec["services"]["coordinator"]["ports"][0].split(":")[0]
    admins = named(commands, "lorm-admin")
    assert {c[1] for c in admins} == {"add-task", "finish"}
    for command in admins:
        args = admin_parser().parse_args(command[1:])
        assert args.target == f"localhost:{port}" and ROOT / args.operator_token_file == token
        assert (ROOT / args.tls_cert, ROOT / args.tls_key) == (pki.client_cert("operator"), pki.client_key("operator"))
    (curl,) = named(commands, "curl")
    assert f"https://localhost:{spec['services']['serve']['ports'][0].split(':')[0]}/v1/predict" in curl
    assert ROOT / curl[curl.index("--cert") + 1] == pki.client_cert("app")


def test_the_docs_make_the_files_the_kustomization_reads(capsys):
    from server.certs import Pki

    commands, made = doc_commands(KUBERNETES), generated()
    (certs,) = named(commands, "lorm-certs")
    values = dict(zip(certs[1::2], certs[2::2]))
    pki = Pki(ROOT / values["--out"])
    tls = {pki.ca, pki.server_cert, pki.server_key, pki.client_cert("health"), pki.client_key("health")}
    assert {p.resolve() for p in made["lorm-coordinator-tls"].values()} == {p.resolve() for p in tls}
    coordinator = site_objects()[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]["containers"][0]
    from server.main import build_parser

    allowed = build_parser().parse_args(coordinator["args"]).allowed_clients.split(",")
    assert set(values["--clients"].split(",")) == {*allowed, "health", "operator", "app"}
    server_host = client_gen().DEFAULT_SERVER.rsplit(":", 1)[0]
    assert {server_host, "lorm-serve.lorm-owned.svc", "coordinator.example"} <= set(values["--hosts"].split(","))
    (digest,) = [c for c in commands if c[0] == "printf"]
    assert [ROOT / digest[-1]] == list(made["lorm-operator"].values())
    (copy,) = named(commands, "cp")
    assert ROOT / copy[1] == DEPLOY / compose_owned()["secrets"]["model-spec"]["file"]
    assert [ROOT / copy[2]] == list(made["lorm-model-spec"].values())
    assert ["kubectl", "apply", "-k", str(SITE.relative_to(ROOT))] in commands

    (gen,) = named(commands, "python3")
    assert ROOT / gen[1] == OWNED / "client_gen.py"
    assert client_gen().main(gen[2 : gen.index(">")]) == 0
    objects = client_objects(capsys.readouterr().out)
    claim = objects["PersistentVolumeClaim"]["metadata"]["name"]
    (secret,) = [
        v["secret"]["secretName"] for v in objects["Job"]["spec"]["template"]["spec"]["volumes"] if "secret" in v
    ]
    create = next(c for c in commands if c[:3] == ["kubectl", "create", "secret"])
    assert create[4] == secret
    (run,) = [c for c in commands if c[:2] == ["kubectl", "run"]]
    overrides = json.loads(next(a for a in run if a.startswith("--overrides=")).partition("=")[2])
    assert overrides["spec"]["volumes"][0]["persistentVolumeClaim"]["claimName"] == claim
    copies = [c for c in commands if c[:2] == ["kubectl", "cp"]]
    mount = overrides["spec"]["containers"][0]["volumeMounts"][0]["mountPath"]
    container = objects["Job"]["spec"]["template"]["spec"]["containers"][0]
    data = {container["args"][container["args"].index(f) + 1] for f in ("--data", "--test-data")}
    assert {c[3].partition(":")[2] for c in copies} == data and all(under(p, mount) for p in data)
    applied = [c for c in commands if c[:3] == ["kubectl", "apply", "-f"]]
    assert {c[3] for c in applied} == {gen[-1]}


def test_the_docs_model_spec_command_gives_the_clients_head():
    """lorm-spec counts data.classes, not data.max_classes: DEPLOY.md's command names as many classes as the
    coordinators' head has rows, else every client's Describe differs from --model-spec and is refused."""
    from common.run.config import add_config_arguments
    from common.run.schedule import configured_classes
    from server.main import build_parser

    (command,) = named(doc_commands(COMPOSE), "lorm-spec")
    parser = argparse.ArgumentParser(prog="lorm-spec")  # as client/spec.py builds it in its main
    add_config_arguments(parser)
    parser.add_argument("--out", required=True)
    spec_config = config_from_args(parser.parse_args(command[1:]))
    pod = site_objects()[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]
    schedule = str(DEPLOY / "schedule.txt")
    for argv in (compose_owned()["services"]["coordinator"]["command"], pod["containers"][0]["args"]):
        args = build_parser().parse_args([schedule if a.endswith("/schedule.txt") else a for a in argv])
        config = schedule_from_args(args, config_from_args(args))
        assert len(configured_classes(spec_config)) == head_classes(config, len(config.section(DataSettings).classes))
        for field in ("backbone", "rank", "lora_scale", "method", "model_seed", "max_length"):
            assert getattr(spec_config, field) == getattr(config, field), field
