"""``lorm-spec`` writes the run's model; ``lorm-server --model-spec`` holds every client to it."""

from __future__ import annotations

import json
import sys

from common.run.config import RunConfig
from common.wire.messages import ModelSpec

from procs import ProjectProc as Proc

CONFIG = RunConfig(
    run_id="spec",
    num_clients=1,
    num_tasks=1,
    rounds_per_task=1,
    local_epochs=1,
    rank=2,
    threads=1,
    seed=2,
    extra={"synthetic_classes": 4, "synthetic_train": 12, "synthetic_test": 4},
)


def test_the_operators_spec_admits_the_real_client_and_refuses_another_model(cluster, tmp_path):
    c = cluster(CONFIG.to_json())
    spec_file = tmp_path / "spec.json"
    writer = Proc(
        "lorm-spec", [sys.executable, "-m", "client.spec", "--config", str(c.config), "--out", str(spec_file)]
    )
    assert writer.wait(timeout=120) == 0
    spec = ModelSpec.from_json(spec_file.read_text())
    assert spec.num_classes == 4 and spec.layers
    assert spec.classes == ("class0", "class1", "class2", "class3") and spec.max_length == CONFIG.max_length
    # Another model's spec (one class more): the real client's Describe is refused, naming the difference.
    other = tmp_path / "other.json"
    other.write_text(json.dumps({**json.loads(spec.to_json()), "num_classes": 5, "classes": None}))
    server = c.server("--model-spec", str(other))
    server.wait_for("serving on")
    client = c.client(0, "--give-up", "5")
    assert client.wait(timeout=120) != 0
    assert "INVALID_ARGUMENT" in "".join(client.lines) and "num_classes 4 instead of 5" in "".join(client.lines)
    server.kill()
    # The right one: the run completes.
    c2 = cluster(CONFIG.to_json(), name="run2")
    server = c2.server("--model-spec", str(spec_file))
    server.wait_for("serving on")
    client = c2.client(0)
    assert client.wait(timeout=180) == 0 and server.wait(timeout=60) == 0
    assert "FAA (mean over tasks, paper)" in "".join(server.lines)


def test_a_client_that_cannot_load_its_data_says_why_and_exits(cluster, tmp_path):
    """A client whose own data files (its flags) are not on its disk: it logs the file it looked for,
    without a traceback, and exits 2."""
    missing = tmp_path / "no-such-train.csv"
    config = RunConfig(**{**json.loads(CONFIG.to_json()), "run_id": "nodata", "dataset": "textfile", "extra": {}})
    c = cluster(config.to_json(), name="nodata")
    server = c.server()
    server.wait_for("serving on")
    client = c.client(0, "--give-up", "5", "--train-file", str(missing), "--test-file", str(missing))
    assert client.wait(timeout=120) == 2
    out = "".join(client.lines)
    assert "cannot load this client's data" in out and "no-such-train.csv" in out and "Traceback" not in out
    server.kill()
