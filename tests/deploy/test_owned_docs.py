"""docs/DEPLOY.md's commands for a run on the clients' own data make the files that deploy/compose-owned.yaml and
deploy/k8s-owned/ read, and parse with their programs' own parsers."""

from __future__ import annotations

import json
import re
import shlex

from test_manifests import DEPLOY, ROOT
from test_owned_compose import compose_owned, under
from test_owned_k8s import OWNED, SITE, client_gen, client_objects, generated, site_objects

from common.run.schedule import config_with_schedule, configured_classes, head_classes
from common.run.settings import DataSettings


def doc_commands(section: str) -> list[list[str]]:
    """The shell commands (words, comments dropped) of the ``bash`` blocks of a section of docs/DEPLOY.md."""
    text = (ROOT / "docs" / "DEPLOY.md").read_text()
    body = text.split(f"\n## {section}\n", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```bash\n(.*?)```", body, flags=re.S)
    assert blocks, section
    return [shlex.split(line, comments=True) for b in blocks for line in b.replace("\\\n", " ").splitlines()]


def named(commands: list[list[str]], program: str) -> list[list[str]]:
    return [c for c in commands if c[0] == program]


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
    layout = {pki.ca, pki.server_cert, pki.server_key, pki.serve_cert, pki.serve_key} | {
        f for c in [*clients, "health"] for f in (pki.client_cert(c), pki.client_key(c))
    }
    files = {name: (DEPLOY / s["file"]).resolve() for name, s in spec["secrets"].items()}
    assert {files[n] for n in files if n not in ("operator-digest", "model-spec")} == {p.resolve() for p in layout}
    assert set(values["--clients"].split(",")) == {*clients, "health", "operator", "app"}
    assert {"coordinator", "127.0.0.1", "localhost"} <= set(values["--hosts"].split(","))
    assert "serve" in values["--serve-hosts"].split(",") and "serve" not in values["--hosts"].split(",")

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
    serve_tls = {pki.ca, pki.serve_cert, pki.serve_key}
    assert {p.resolve() for p in made["lorm-serve-tls"].values()} == {p.resolve() for p in serve_tls}
    coordinator = site_objects()[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]["containers"][0]
    from server.main import build_parser

    allowed = build_parser().parse_args(coordinator["args"]).allowed_clients.split(",")
    assert set(values["--clients"].split(",")) == {*allowed, "health", "operator", "app"}
    server_host = client_gen().DEFAULT_SERVER.rsplit(":", 1)[0]
    assert {server_host, "coordinator.example"} <= set(values["--hosts"].split(","))
    assert "lorm-serve.lorm-owned.svc" in values["--serve-hosts"].split(",")
    assert not {"lorm-serve", "lorm-serve.lorm-owned.svc"} & set(values["--hosts"].split(","))
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
    """DEPLOY.md's lorm-spec command describes the coordinators' run: as many head rows as the clients build
    (data.max_classes, not the schedule's first classes), else every client's Describe differs from
    --model-spec and is refused."""
    from client import spec
    from server.main import build_parser

    schedule = str(DEPLOY / "schedule.txt")
    (command,) = named(doc_commands(COMPOSE), "lorm-spec")
    argv = [schedule if a.endswith("/schedule.txt") else a for a in command[1:]]
    parser = spec.build_parser()
    spec_config = spec.config_of(parser, parser.parse_args(argv))
    rows = head_classes(spec_config, len(configured_classes(spec_config) or []))
    pod = site_objects()[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]
    for coordinator in (compose_owned()["services"]["coordinator"]["command"], pod["containers"][0]["args"]):
        config = config_with_schedule(
            build_parser().parse_args([schedule if a.endswith("/schedule.txt") else a for a in coordinator])
        )
        assert rows == head_classes(config, len(config.section(DataSettings).classes)) == 8
        for field in ("backbone", "rank", "lora_scale", "method", "model_seed", "max_length", "task_sizes"):
            assert getattr(spec_config, field) == getattr(config, field), field
