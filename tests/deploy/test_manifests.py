"""deploy/: the compose files and Kubernetes manifests against the Compose specification, the
Dockerfiles, the console scripts and their flags, and each other (every image, port, volume,
secret and environment variable they name exists and agrees)."""

from __future__ import annotations

import importlib.util
import json
import re
import shutil
import subprocess
import sys
from functools import lru_cache
from pathlib import Path

import pytest
import tomllib
import yaml

from server.certs import Pki

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
# Image name -> the Dockerfile that builds it (deploy/build-and-run.sh tags them so).
IMAGES = {"lorm-coordinator": "coordinator.Dockerfile", "lorm-client": "client.Dockerfile"}
NUM_CLIENTS = 3


# ------------------------------------------------------------------ helpers


def interpolate(text: str) -> str:
    """Compose's ``${VAR:-default}`` and ``${VAR-default}`` with every variable unset."""
    return re.sub(r"\$\{([A-Z0-9_]+):?-([^}]*)\}", lambda m: m.group(2), text)


def load_compose(name: str) -> dict:
    return yaml.safe_load(interpolate((DEPLOY / name).read_text()))


def compose_gen():
    spec = importlib.util.spec_from_file_location("compose_gen", DEPLOY / "compose_gen.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@lru_cache
def console_scripts() -> dict[str, str]:
    """Console script -> module, from pyproject.toml."""
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    return {name: target.split(":")[0] for name, target in scripts.items()}


@lru_cache
def flags_of(script: str) -> frozenset[str]:
    """Every option the script's parser accepts, read from its --help (what a user would see)."""
    out = subprocess.run(
        [sys.executable, "-m", console_scripts()[script], "--help"],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return frozenset(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]*)", out.stdout))


def flag_values(argv: list[str]) -> dict[str, str | bool]:
    """``--flag value`` pairs (``True`` for a flag without a value) of an argument list."""
    values: dict[str, str | bool] = {}
    for i, token in enumerate(argv):
        if token.startswith("--"):
            nxt = argv[i + 1] if i + 1 < len(argv) else None
            values[token] = nxt if nxt is not None and not nxt.startswith("--") else True
    return values


def assert_valid_invocation(script: str, argv: list[str], where: str) -> None:
    """``script argv`` names a console script and only flags its parser has."""
    assert script in console_scripts(), f"{where}: {script!r} is not a console script of pyproject.toml"
    unknown = sorted({t for t in argv if t.startswith("--")} - flags_of(script))
    assert not unknown, f"{where}: {script} has no flags {unknown}"


def dockerfile(name: str) -> str:
    # Join continuation lines so that each instruction is one line.
    return re.sub(r"\\\n\s*", " ", (DEPLOY / name).read_text())


def instruction(text: str, name: str) -> list[str]:
    return re.findall(rf"^{name}\s+(.+)$", text, flags=re.M)


def exec_form(text: str, name: str) -> list[str]:
    found = instruction(text, name)
    assert len(found) == 1, f"expected one {name}, got {found}"
    return json.loads(found[0])


def image_name(image: str) -> str:
    return image.rsplit("/", 1)[-1].split(":")[0]


def env_read_by_code(name: str) -> bool:
    sources = [p for d in ("common", "server", "client", "engine") for p in (ROOT / d).rglob("*.py")]
    return any(name in p.read_text() for p in sources)


def mounted_file(path: str, mounts: dict[str, set[str]]) -> bool:
    """``path`` is a file under one of ``mounts`` (mount point -> file names it holds)."""
    parent, _, leaf = path.rpartition("/")
    return leaf in mounts.get(parent, set())


def test_every_yaml_file_of_deploy_parses():
    files = sorted(DEPLOY.rglob("*.yaml"))
    assert len(files) >= 10, files
    for path in files:
        docs = list(yaml.safe_load_all(path.read_text()))
        assert docs and all(isinstance(d, dict) for d in docs), path


# ------------------------------------------------------------------ Dockerfiles


@pytest.mark.parametrize("image", sorted(IMAGES))
def test_dockerfile_runs_a_console_script_as_non_root_with_a_writable_home(image):
    text = dockerfile(IMAGES[image])
    entry = exec_form(text, "ENTRYPOINT")
    assert len(entry) == 1 and entry[0] in console_scripts(), entry
    assert_valid_invocation(entry[0], exec_form(text, "CMD"), f"{IMAGES[image]} CMD")
    user = instruction(text, "USER")
    assert user and re.fullmatch(r"\d+(:\d+)?", user[-1].strip()), "USER must be numeric (runAsNonRoot checks it)"
    uid = user[-1].split(":")[0]
    assert uid != "0"
    home = re.search(r"HOME=(\S+)", text).group(1)
    assert re.search(rf"useradd[^\n]*--uid \"?\$LORM_UID\"?[^\n]*--home-dir {home}", text)
    assert re.search(rf"ARG LORM_UID={uid}\b", text)
    assert re.search(rf"chown -R \"?\$LORM_UID\"?:0 [^\n]*{home}", text), "the home must belong to the user"
    for cache in ("XDG_CACHE_HOME", "MPLCONFIGDIR", "HF_HOME"):
        assert re.search(rf"{cache}={home}/", text), f"{cache} must lie in the writable home"
    for source in re.findall(r"^COPY (\S+) ", text, flags=re.M):
        assert (ROOT / source).exists(), f"{IMAGES[image]} copies {source}, which does not exist"


def test_client_image_has_a_cuda_base_and_the_demo_weights():
    text = dockerfile("client.Dockerfile")
    assert re.search(r"^ARG CUDA_BASE=nvidia/cuda:\S+", text, flags=re.M)
    assert "FROM ${CUDA_BASE}" in text and '".[minilm]"' in text


# ------------------------------------------------------------------ compose


def test_compose_files_are_what_the_generator_writes():
    gen = compose_gen()
    assert (DEPLOY / "compose.yaml").read_text() == gen.compose(NUM_CLIENTS)
    assert (DEPLOY / "compose.gpu.yaml").read_text() == gen.compose_gpu(NUM_CLIENTS)


@pytest.mark.parametrize("n", [1, 3, 8])
def test_compose_is_valid_against_the_compose_specification(n):
    from compose_spec import PyCompose

    gen = compose_gen()
    parsed = PyCompose.from_json(json.dumps(yaml.safe_load(interpolate(gen.compose(n)))))
    assert parsed.service_names() == ["coordinator"] + [f"client-{i}" for i in range(n)]
    PyCompose.from_json(json.dumps(yaml.safe_load(gen.compose_gpu(n))))


def test_the_schema_check_catches_a_misspelt_key():
    from compose_spec import PyCompose

    spec = load_compose("compose.yaml")
    spec["services"]["coordinator"]["healtcheck"] = spec["services"]["coordinator"].pop("healthcheck")
    with pytest.raises(ValueError, match="healtcheck"):
        PyCompose.from_json(json.dumps(spec))


def service_argv(service: dict) -> tuple[str, list[str]]:
    """(console script, arguments) a service runs: its image's entry point and its command."""
    text = dockerfile(IMAGES[image_name(service["image"])])
    (script,) = exec_form(text, "ENTRYPOINT")
    return script, service.get("command", exec_form(text, "CMD"))


def test_compose_cross_references():
    spec = load_compose("compose.yaml")
    services = spec["services"]
    coordinator = services["coordinator"]
    clients = {name: s for name, s in services.items() if name != "coordinator"}
    assert len(clients) == NUM_CLIENTS

    # Images: built by the Dockerfile that the image name stands for.
    for name, s in services.items():
        assert s["build"]["dockerfile"] == f"deploy/{IMAGES[image_name(s['image'])]}", name
        assert (DEPLOY / s["build"]["context"]).resolve() == ROOT

    # The coordinator's command: real flags, the right number of clients, ports exposed and published.
    script, argv = service_argv(coordinator)
    assert script == "lorm-server"
    assert_valid_invocation(script, argv, "coordinator command")
    from server.main import build_parser

    args = build_parser().parse_args(argv)
    exposed = {int(p) for line in instruction(dockerfile(IMAGES["lorm-coordinator"]), "EXPOSE") for p in line.split()}
    assert {args.port, args.metrics_port} <= exposed
    assert {f"{args.port}:{args.port}", f"{args.metrics_port}:{args.metrics_port}"} <= set(coordinator["ports"])
    ids = [s["environment"]["LORM_CLIENT_ID"] for s in clients.values()]
    assert args.allowed_clients.split(",") == ids == [f"client-{i}" for i in range(NUM_CLIENTS)]
    assert f"num_clients={NUM_CLIENTS}" in args.set
    assert sorted(int(s["environment"]["LORM_CLIENT_INDEX"]) for s in clients.values()) == list(range(NUM_CLIENTS))

    # Volumes: declared, and mounted where the command keeps state and results.
    named = {
        m.split(":")[0]: m.split(":")[1]
        for s in services.values()
        for m in s["volumes"]
        if ":" in m and not m.startswith((".", "/"))
    }
    assert set(named) <= set(spec["volumes"]), f"undeclared volumes {set(named) - set(spec['volumes'])}"
    assert named["state"] == args.state_dir and named["results"] == args.results_dir

    # Secrets: declared, their files in the layout lorm-certs writes, and every TLS path a command uses mounted.
    pki = Pki(DEPLOY / "certs")
    expected = {
        "ca": pki.ca,
        "coordinator-cert": pki.server_cert,
        "coordinator-key": pki.server_key,
        "health-cert": pki.client_cert("health"),
        "health-key": pki.client_key("health"),
        "model-spec": DEPLOY / "model-spec.json",
    }
    for i in range(NUM_CLIENTS):
        c = f"client-{i}"
        expected |= {f"{c}-cert": pki.client_cert(c), f"{c}-key": pki.client_key(c)}
    assert {k: (DEPLOY / v["file"]).resolve() for k, v in spec["secrets"].items()} == {
        k: v.resolve() for k, v in expected.items()
    }
    for name, s in services.items():
        sources = {x["source"] for x in s["secrets"]}
        assert sources <= set(spec["secrets"]), name
        mounts = {"/run/secrets": {x["target"] for x in s["secrets"]}}
        script, argv = service_argv(s)
        commands = [argv] + ([s["healthcheck"]["test"][2:]] if "healthcheck" in s else [])
        for command in commands:
            for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
                path = flag_values(command)[flag]
                assert mounted_file(path, mounts), f"{name}: {flag} {path} is not a mounted secret"
    for name, s in clients.items():
        i = s["environment"]["LORM_CLIENT_INDEX"]
        assert {x["source"] for x in s["secrets"]} == {"ca", f"client-{i}-cert", f"client-{i}-key"}, name

    # The health check: the real probe, at the coordinator's port, over its TLS.
    test = coordinator["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "lorm-health"
    assert_valid_invocation("lorm-health", test[2:], "healthcheck")
    from server.health import build_parser as health_parser

    probe = health_parser().parse_args(test[2:])
    assert probe.target == f"127.0.0.1:{args.port}" and probe.tls_ca == args.tls_ca
    for s in clients.values():
        assert s["depends_on"]["coordinator"]["condition"] == "service_healthy"

    # Clients: real flags, the coordinator's address, data where the code reads it, env the code reads.
    for name, s in clients.items():
        script, argv = service_argv(s)
        assert script == "lorm-client"
        assert_valid_invocation(script, argv, f"{name} command")
        assert s["environment"]["LORM_SERVER"] == f"coordinator:{args.port}"
        data = {m.split(":")[1] for m in s["volumes"] if m.startswith(("/", ".", "..")) or m.count(":") == 2}
        assert s["environment"]["LORM_DATA_DIR"] in data
        assert float(flag_values(argv)["--call-timeout"]) >= 600, "large updates need a long per-call timeout"
    for name, s in services.items():
        for var in s.get("environment", {}):
            assert env_read_by_code(var), f"{name}: environment {var} is read by no code"


def test_the_shipped_coordinators_hold_clients_to_the_operators_model_spec():
    """Without --model-spec the first client's Describe fixes the run's model. Compose, the
    image's default command and Kubernetes each pass it, a file mounted where the flag points."""
    from server.main import build_parser

    compose = load_compose("compose.yaml")
    coordinator = compose["services"]["coordinator"]
    _, argv = service_argv(coordinator)
    spec_path = build_parser().parse_args(argv).model_spec
    assert spec_path, "compose: the coordinator has no --model-spec"
    assert mounted_file(spec_path, {"/run/secrets": {x["target"] for x in coordinator["secrets"]}}), spec_path
    (source,) = [x["source"] for x in coordinator["secrets"] if spec_path.endswith("/" + x["target"])]
    assert compose["secrets"][source]["file"] == "./model-spec.json"
    assert (
        "lorm-spec" in (DEPLOY / "build-and-run.sh").read_text()
        and "/out/model-spec.json" in (DEPLOY / "build-and-run.sh").read_text()
    )
    cmd = exec_form(dockerfile(IMAGES["lorm-coordinator"]), "CMD")
    assert build_parser().parse_args(cmd).model_spec == spec_path  # the image's default is the compose run's

    pod = k8s_objects()[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    k8s_path = build_parser().parse_args(container["args"]).model_spec
    assert k8s_path, "k8s: the coordinator has no --model-spec"
    parent, _, leaf = k8s_path.rpartition("/")
    (mount,) = [m for m in container["volumeMounts"] if m["mountPath"] == parent]
    (volume,) = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    maps = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert leaf in maps[volume["configMap"]["name"]]


def test_compose_gpu_overlay_reserves_one_gpu_per_existing_client():
    base, gpu = load_compose("compose.yaml"), load_compose("compose.gpu.yaml")
    assert set(gpu["services"]) == {n for n in base["services"] if n != "coordinator"}
    for s in gpu["services"].values():
        (device,) = s["deploy"]["resources"]["reservations"]["devices"]
        assert device == {"driver": "nvidia", "count": 1, "capabilities": ["gpu"]}


def test_docker_compose_config_when_the_cli_has_compose():
    docker = shutil.which("docker")
    if docker is None or subprocess.run([docker, "compose", "version"], capture_output=True).returncode != 0:
        pytest.skip("no `docker compose` CLI here (the parse needs no engine, but the plugin is missing)")
    out = subprocess.run(
        [
            docker,
            "compose",
            "-f",
            "compose.yaml",
            "-f",
            "compose.gpu.yaml",
            "config",
            "--quiet",
            "--no-path-resolution",
        ],
        cwd=DEPLOY,
        capture_output=True,
        text=True,
        timeout=60,
    )
    if "secret" in out.stderr and "not found" in out.stderr.lower():
        pytest.skip("docker compose config needs deploy/certs (bash deploy/build-and-run.sh creates it)")
    assert out.returncode == 0, out.stderr


# ------------------------------------------------------------------ Kubernetes


def k8s_objects() -> dict[tuple[str, str], dict]:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    objects = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((DEPLOY / "k8s" / resource).read_text()):
            assert {"apiVersion", "kind", "metadata"} <= set(doc), resource
            objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return objects


def secret_keys() -> dict[str, set[str]]:
    kustomization = yaml.safe_load((DEPLOY / "k8s" / "kustomization.yaml").read_text())
    keys = {}
    pki = Pki(DEPLOY / "k8s" / "certs")
    ids = [f"client-{i}" for i in range(NUM_CLIENTS)] + ["health"]
    layout = {pki.ca, pki.server_cert, pki.server_key} | {
        f for c in ids for f in (pki.client_cert(c), pki.client_key(c))
    }
    for gen in kustomization["secretGenerator"]:
        names = set()
        for entry in gen["files"]:
            key, _, path = entry.partition("=")
            assert (DEPLOY / "k8s" / path).resolve() in {p.resolve() for p in layout}, f"{path}: not a lorm-certs file"
            names.add(key)
        keys[gen["name"]] = names
    return keys


def pod_mounts(pod: dict, container: dict, objects: dict, secrets: dict[str, set[str]]) -> dict[str, set[str]]:
    """Mount point -> files, for the secret volumes; checks that every mount names a declared volume."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    mounts: dict[str, set[str]] = {}
    for m in container["volumeMounts"]:
        assert m["name"] in volumes, f"volume {m['name']} is mounted but not declared"
        v = volumes[m["name"]]
        if "secret" in v:
            assert v["secret"]["secretName"] in secrets, f"secret {v['secret']['secretName']} is generated by nothing"
            mounts[m["mountPath"]] = secrets[v["secret"]["secretName"]]
        if "persistentVolumeClaim" in v:
            claim = v["persistentVolumeClaim"]["claimName"]
            assert ("PersistentVolumeClaim", claim) in objects, f"claim {claim} is not declared"
    return mounts


def assert_secure_pod(pod: dict, container: dict, image: str) -> None:
    uid = exec_uid(image)
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] == uid
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    home = re.search(r"HOME=(\S+)", dockerfile(IMAGES[image])).group(1)
    assert home in {m["mountPath"] for m in container["volumeMounts"]}, "a read-only root needs a writable home"


def exec_uid(image: str) -> int:
    return int(instruction(dockerfile(IMAGES[image]), "USER")[-1].split(":")[0])


def test_k8s_coordinator_deployment_service_and_state():
    objects, secrets = k8s_objects(), secret_keys()
    deploy = objects[("Deployment", "lorm-coordinator")]
    assert deploy["spec"]["replicas"] == 1 and deploy["spec"]["strategy"]["type"] == "Recreate"
    pod = deploy["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    assert image_name(container["image"]) == "lorm-coordinator"
    script = exec_form(dockerfile(IMAGES["lorm-coordinator"]), "ENTRYPOINT")[0]
    assert_valid_invocation(script, container["args"], "coordinator args")
    from server.main import build_parser

    args = build_parser().parse_args(container["args"])
    assert args.keep_serving, "a Deployment restarts an exited process: the coordinator must keep serving"
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    assert ports == {"grpc": args.port, "metrics": args.metrics_port}
    mounts = pod_mounts(pod, container, objects, secrets)
    state_mounts = [m["mountPath"] for m in container["volumeMounts"] if m["name"] == "state"]
    assert state_mounts and args.state_dir.startswith(state_mounts[0] + "/")
    assert args.results_dir.startswith(state_mounts[0] + "/")
    for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
        assert mounted_file(flag_values(container["args"])[flag], mounts), flag
    from server.health import build_parser as health_parser

    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        command = container[probe]["exec"]["command"]
        assert command[0] == "lorm-health"
        assert_valid_invocation("lorm-health", command[1:], probe)
        parsed = health_parser().parse_args(command[1:])
        assert parsed.target == f"127.0.0.1:{args.port}"
        for flag in ("--tls-ca", "--tls-cert", "--tls-key"):
            assert mounted_file(flag_values(command[1:])[flag], mounts), (probe, flag)
    assert_secure_pod(pod, container, "lorm-coordinator")

    service = objects[("Service", "lorm-coordinator")]
    labels = deploy["spec"]["template"]["metadata"]["labels"]
    assert service["spec"]["selector"].items() <= labels.items()
    assert deploy["spec"]["selector"]["matchLabels"].items() <= labels.items()
    assert {p["targetPort"] for p in service["spec"]["ports"]} <= set(ports)
    assert ("PersistentVolumeClaim", "lorm-state") in objects


def run_init_container(init: dict, pod: dict, secrets: dict[str, set[str]], index: int, root: Path) -> dict[str, Path]:
    """Run ``init``'s shell command as pod ``index``'s kubelet would, its mounts as folders under
    ``root`` (secret files hold their own key names). Returns volume name -> folder."""
    volumes = {v["name"]: v for v in pod["volumes"]}
    env = {e["name"]: e for e in init["env"]}
    assert (
        env["LORM_CLIENT_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    shell, flag, command = init["command"]
    assert (shell, flag) == ("sh", "-c")
    command = command.replace("$(LORM_CLIENT_INDEX)", str(index))
    folders = {}
    for m in sorted(init["volumeMounts"], key=lambda m: -len(m["mountPath"])):  # /all-certs before /certs
        folder = root / f"pod{index}-{m['name']}"
        folder.mkdir()
        volume = volumes[m["name"]]
        if "secret" in volume:
            for key in secrets[volume["secret"]["secretName"]]:
                (folder / key).write_text(key)
        command = re.sub(rf"(?<![\w-]){re.escape(m['mountPath'])}(?=/|\b)", str(folder), command)
        folders[m["name"]] = folder
    done = subprocess.run(["sh", "-c", command], capture_output=True, text=True, timeout=30)
    assert done.returncode == 0, done.stderr
    return folders


def test_k8s_client_container_sees_only_its_own_key(tmp_path):
    objects, secrets = k8s_objects(), secret_keys()
    pod = objects[("Job", "lorm-clients")]["spec"]["template"]["spec"]
    (container,) = pod["containers"]
    (init,) = pod["initContainers"]
    assert image_name(init["image"]) == "lorm-client" and init["securityContext"]["readOnlyRootFilesystem"] is True
    assert not pod_mounts(pod, container, objects, secrets), "a client container that mounts the secret sees every key"
    pod_mounts(pod, init, objects, secrets)  # its volumes are declared and its secret generated
    volumes = {v["name"]: v for v in pod["volumes"]}
    by_path = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    for i in range(NUM_CLIENTS):
        folders = run_init_container(init, pod, secrets, i, tmp_path)
        argv = [a.replace("$(LORM_CLIENT_INDEX)", str(i)) for a in container["args"]]
        wanted = {"--tls-ca": "ca.crt", "--tls-cert": f"client-{i}.crt", "--tls-key": f"client-{i}.key"}
        for flag, content in wanted.items():
            parent, _, leaf = flag_values(argv)[flag].rpartition("/")
            volume = by_path[parent]
            assert "emptyDir" in volumes[volume] and volumes[volume]["emptyDir"].get("medium") == "Memory", volume
            path = folders[volume] / leaf
            assert path.read_text() == content, (i, flag)
            assert path.stat().st_mode & 0o077 == 0, "a copied file must be its owner's alone"
        assert sorted(p.name for p in folders[by_path["/certs"]].iterdir()) == ["ca.crt", "client.crt", "client.key"]


def test_k8s_clients_indexed_job_with_gpus():
    objects, secrets = k8s_objects(), secret_keys()
    job = objects[("Job", "lorm-clients")]
    coordinator = objects[("Deployment", "lorm-coordinator")]["spec"]["template"]["spec"]["containers"][0]
    from server.main import build_parser

    server_args = build_parser().parse_args(coordinator["args"])
    spec = job["spec"]
    assert spec["completionMode"] == "Indexed"
    assert spec["completions"] == spec["parallelism"] == NUM_CLIENTS
    assert f"num_clients={spec['completions']}" in server_args.set
    pod = spec["template"]["spec"]
    (container,) = pod["containers"]
    assert image_name(container["image"]) == "lorm-client"
    assert container["resources"]["requests"]["nvidia.com/gpu"] == container["resources"]["limits"]["nvidia.com/gpu"]
    env = {e["name"]: e for e in container["env"]}
    assert (
        env["LORM_CLIENT_INDEX"]["valueFrom"]["fieldRef"]["fieldPath"]
        == "metadata.annotations['batch.kubernetes.io/job-completion-index']"
    )
    for name in env:
        assert env_read_by_code(name), f"environment {name} is read by no code"
    service = objects[("Service", "lorm-coordinator")]
    grpc_port = next(p["port"] for p in service["spec"]["ports"] if p["name"] == "grpc")
    assert env["LORM_SERVER"]["value"] == f"{service['metadata']['name']}:{grpc_port}" and grpc_port == server_args.port
    mounts = pod_mounts(pod, container, objects, secrets)
    script = exec_form(dockerfile(IMAGES["lorm-client"]), "ENTRYPOINT")[0]
    assert_valid_invocation(script, container["args"], "client args")
    ids = []
    assert not mounts  # its TLS files come from the init container (test above)
    for i in range(spec["completions"]):  # what the kubelet makes of $(VAR) in pod i
        ids.append(env["LORM_CLIENT_ID"]["value"].replace("$(LORM_CLIENT_INDEX)", str(i)))
    assert ids == server_args.allowed_clients.split(",")
    data = next(m["mountPath"] for m in container["volumeMounts"] if m["name"] == "data")
    assert env["LORM_DATA_DIR"]["value"] == data
    assert pod["restartPolicy"] == "OnFailure"  # a failed pod restarts with the same index and identity
    assert_secure_pod(pod, container, "lorm-client")
