"""H3 and M6, and clients on their own data, over a real client process: a coordinator's configuration below the
client's floor, one that picks the client's files, or one that disagrees with the client on whose data it
trains on, is refused right after Join, naming the setting, and the client sends nothing more (no Describe,
no key, no share, no push). M6's other half, ``lorm-launch`` giving each client its files by its own flags, is
checked where the README runs it (``tests/test_readme.py``)."""

from __future__ import annotations

import sys

import pytest

from common.infra.tls import Security
from common.run.config import RunConfig
from server.coordinator import Coordinator
from server.service import create_server

from procs import ProjectProc as Proc

BASE = dict(num_tasks=1, rounds_per_task=1, local_epochs=1, rank=2, threads=1)
OWNED = {"owned": True, "classes": ["alarm", "balance"]}


@pytest.mark.parametrize(
    ("config", "flags", "named"),
    [
        # H3: a coordinator that lowered the threshold (declaring itself unsafe does not bind the client)
        (
            RunConfig(
                num_clients=3, settings={"secagg": {"enabled": True, "threshold": 1, "unsafe_low_threshold": True}}
            ),
            [],
            "secagg.threshold=1 for num_clients=3, below this client's floor of 2 (mode honest's for 3)",
        ),
        # H3: a coordinator that switched secure aggregation off
        (RunConfig(num_clients=3), ["--require-secure-aggregation"], "sets secagg.enabled=false"),
        # H3: a run too small for the client
        (RunConfig(num_clients=2), ["--min-clients", "3"], "num_clients=2, below this client's floor of 3"),
        # a coordinator that swapped the public prior the client vetted for another (slow: the refusal's path is the
        # other cases', and tests/client/test_floor.py checks the pin itself)
        pytest.param(
            RunConfig(num_clients=2, method="ncm", settings={"ncm": {"prior_digest": "cd" * 32, "prior_k": 4}}),
            ["--public-prior-digest", "ab" * 32],
            f"names the public prior {'cd' * 32}",
            marks=pytest.mark.slow,
        ),
        # M6: a coordinator that picks the client's data directory, data file or weight file
        (RunConfig(num_clients=2, data_dir="/x"), [], "sets data_dir=/x: a client's data paths are its own"),
        (
            RunConfig(num_clients=2, dataset="textfile", settings={"data": {"train_file": "/etc/hostname"}}),
            ["--data-dir", "/tmp"],
            "sets data.train_file=/etc/hostname: a client's data paths are its own; pass --train-file",
        ),
        (
            RunConfig(num_clients=2, backbone="bert:someone/model"),
            [],
            "sets backbone=bert:someone/model, a local path or hub repository",
        ),
        # Clients' own data: a coordinator that picks the folder of the clients' own data; a run and a client that
        # disagree on whose data the client trains on
        (
            RunConfig(num_clients=2, dataset="textfile", settings={"data": {**OWNED, "clients_dir": "/x"}}),
            ["--data", "/tmp/mine.csv"],
            "sets data.clients_dir=/x: a client's data paths are its own; pass --data and --test-data",
        ),
        (
            RunConfig(num_clients=2, dataset="textfile", settings={"data": OWNED}),
            [],
            "sets data.owned=true): pass --data PATH",
        ),
        (RunConfig(num_clients=2), ["--data", "/tmp/mine.csv"], "given --data, but the run's clients train on"),
    ],
    ids=[
        "low-threshold",
        "secagg-off",
        "few-clients",
        "other-prior",
        "data-dir",
        "train-file",
        "hub-backbone",
        "clients-dir",
        "owned-without-data",
        "data-in-a-shard-run",
    ],
)
def test_a_client_refuses_before_sending_anything(tmp_path, config, flags, named):
    config = config.replace(run_id="floor", **BASE)
    coordinator = Coordinator(config, tmp_path / "state")  # a coordinator that sends what it likes
    server, port = create_server(coordinator, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    try:
        client = Proc(
            "client-0",
            [sys.executable, "-m", "client.main", "--server", f"127.0.0.1:{port}", "--client-id", "client-0"]
            + ["--index", "0", "--give-up", "10", "--insecure", *flags],
        )
        assert client.wait(timeout=120) == 3
        out = "".join(client.lines)
        assert "refusing run floor" in out and named in out, out
        assert "Traceback" not in out and "model:" not in out
        # Joined, then nothing: no model described (the run's model would be fixed by it), no step begun.
        status = coordinator.status()
        assert status["clients_joined"] == 1 and status["state"] == "waiting_for_clients"
        assert coordinator.run.spec is None
    finally:
        server.stop(0)


def test_an_accepted_run_logs_the_secure_aggregation_it_accepted(cluster):
    """The same client with a floor the run meets: it logs what it accepted, and the run completes."""
    secure = {"secagg": {"enabled": True}, "data": {"synthetic_classes": 4, "synthetic_train": 12}}
    c = cluster(RunConfig(run_id="floor-ok", num_clients=1, settings=secure, **BASE).to_json())
    server = c.server()
    server.wait_for("serving on")
    client = c.client(0, "--min-clients", "1", "--min-secagg-threshold", "1")
    assert client.wait(timeout=180) == 0, "".join(client.lines[-20:])
    accepted = "".join(line for line in client.lines if "accepted" in line)
    assert "accepted n 1 clients, threshold t 1, mode honest, no privacy budget" in accepted, accepted
    assert server.wait(timeout=60) == 0


def test_the_coordinator_refuses_a_configuration_that_names_a_clients_files(tmp_path):
    """M6: lorm-server needs no data path, and says at start-up that its clients would refuse one."""
    server = Proc(
        "server",
        [sys.executable, "-m", "server.main", "--set", "data_dir=/x", "--state-dir", str(tmp_path / "state")]
        + ["--insecure", "--port", "0"],
    )
    assert server.wait(timeout=120) == 2
    out = "".join(server.lines)
    assert "the configuration sets data_dir=/x, a client's own setting" in out and "--data-dir or LORM_DATA_DIR" in out
    assert not (tmp_path / "state").exists()
