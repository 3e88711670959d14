"""Operations: Prometheus metrics of coordinator and client, and JSON logs, from real processes."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import sys
import urllib.request
from pathlib import Path

import grpc
import pytest
import torch

from client.telemetry import ClientMetrics
from common.run.config import RunConfig
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc

import netns
from procenv import project_pythonpath
from procs import free_port

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(sys.executable).parent
CONFIG = RunConfig(
    run_id="obs",
    num_clients=1,
    num_tasks=1,
    rounds_per_task=2,
    local_epochs=1,
    rank=2,
    lr=3e-2,
    lr_lora=1e-3,
    threads=1,
    seed=3,
    extra={"synthetic_classes": 4, "synthetic_train": 20, "synthetic_test": 8},
)


def scrape(port: int) -> dict[str, float]:
    """``{'name{labels}': value}`` of every sample on ``/metrics``."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10).read().decode()
    samples = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            key, _, value = line.rpartition(" ")
            samples[key] = float(value)
    return samples


def spawn(name: str, cmd: list[str]) -> netns.Proc:
    return netns.Proc(name, cmd, {**os.environ, "PYTHONPATH": project_pythonpath(), "PYTHONUNBUFFERED": "1"}, ROOT)


def refuse_two_submissions(port: int) -> None:
    """A push that is not an update, and an evaluation report from a client that never joined."""
    with grpc.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Push(iter([pb.UpdateChunk()]), timeout=30)
        assert err.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        with pytest.raises(grpc.RpcError) as err:
            stub.ReportEval(
                pb.EvalReport(run_id="obs", client_id="stranger", idempotency_key="k", correct=[1], total=[2]),
                timeout=30,
            )
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED


def test_coordinator_metrics_and_json_logs_of_a_run(tmp_path):
    (tmp_path / "config.json").write_text(CONFIG.to_json())
    port, metrics_port = free_port(), free_port()
    server = spawn(
        "server",
        [
            str(BIN / "lorm-server"),
            "--config",
            str(tmp_path / "config.json"),
            "--state-dir",
            str(tmp_path / "state"),
            "--port",
            str(port),
            "--metrics-port",
            str(metrics_port),
            "--insecure",
            "--log-format",
            "json",
            "--linger",
            "2",
            "--keep-serving",
        ],
    )
    client = None
    try:
        server.wait_for("serving on", timeout=240)
        before = scrape(metrics_port)
        assert before['lorm_run_info{run_id="obs",state="waiting_for_clients"}'] == 1
        assert before["lorm_clients_joined"] == 0
        refuse_two_submissions(port)
        client = spawn(
            "client",
            [
                str(BIN / "lorm-client"),
                "--server",
                f"127.0.0.1:{port}",
                "--client-id",
                "c0",
                "--insecure",
                "--log-format",
                "json",
            ],
        )
        server.wait_for("serving its status until SIGTERM", timeout=600)
        assert client.wait(timeout=120) == 0
        after = scrape(metrics_port)
        server.proc.send_signal(signal.SIGTERM)
        assert server.wait(timeout=60) == 0
    finally:
        for p in (server, client):
            if p is not None:
                p.kill()

    assert after['lorm_run_info{run_id="obs",state="done"}'] == 1
    assert after["lorm_clients_joined"] == 1 and after["lorm_clients_connected"] == 1
    steps = len(json.loads((tmp_path / "state" / "results" / "metrics.json").read_text())["history"])
    assert after["lorm_steps_completed"] == steps >= 3  # B, A (and the task's Gram pass), evaluation
    assert after['lorm_received_bytes_total{method="Push"}'] > 10_000  # the updates' tensors
    assert after['lorm_sent_bytes_total{method="Pull"}'] > 10_000  # the plans' tensors
    assert after['lorm_rejected_submissions_total{reason="invalid_argument"}'] == 1
    assert after['lorm_rejected_submissions_total{reason="permission_denied"}'] == 1
    assert after['lorm_merge_seconds_count{phase="train"}'] == CONFIG.rounds_per_task
    assert after['lorm_merge_seconds_sum{phase="train"}'] > 0

    for proc, who in ((server, None), (client, "c0")):
        records = [json.loads(line) for line in proc.lines]  # every line is one JSON object
        assert records and all({"ts", "level", "logger", "msg"} <= r.keys() for r in records)
        for r in records:
            assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", r["ts"]), r
        steps = [
            r
            for r in records
            if re.match(r"task \d+ (round \d+ \S+ \S+ merged|evaluated)", r["msg"])
            or re.match(r"task \d+ round \d+ \S+ \S+: \d+ samples", r["msg"])
        ]
        assert steps, [r["msg"] for r in records]
        for r in steps:  # an event about a step carries its run, task and round (and client)
            task, round_ = map(int, re.match(r"task (\d+)(?: round (\d+))?", r["msg"]).groups(default="-1"))
            assert r["run"] == "obs" and r["task"] == task, r
            assert round_ < 0 or r["round"] == round_, r
            assert r.get("client") == who, r


def test_client_metrics_endpoint():
    metrics = ClientMetrics()
    metrics.watch_device(torch.device("cpu"))
    port = metrics.serve(0, "127.0.0.1")
    metrics.step_done("train", task=1, round_=2, samples=300, seconds=1.5, loss=0.75)
    metrics.step_done("task_gram", task=1, round_=2, samples=100, seconds=0.5, loss=float("nan"))
    got = scrape(port)
    assert got['lorm_client_samples_per_second{phase="train"}'] == pytest.approx(200.0)
    assert got['lorm_client_samples_total{phase="train"}'] == 300
    assert got['lorm_client_steps_total{phase="task_gram"}'] == 1
    assert got["lorm_client_train_loss"] == 0.75  # a step that trained nothing leaves the loss alone
    assert (got["lorm_client_task"], got["lorm_client_round"]) == (1, 2)
    assert not any("gpu" in k for k in got)  # no GPU metrics without a GPU


def test_client_metrics_listen_on_the_clients_own_host_by_default():
    """A client's /metrics tells its own sample counts and loss: by default only its own
    host may read them. Bound to 0.0.0.0 it would answer on 127.0.0.2 too (Linux routes 127/8 to lo)."""
    metrics = ClientMetrics()
    port = metrics.serve(0)
    metrics.step_done("train", task=0, round_=0, samples=321, seconds=1.0, loss=0.5)
    assert scrape(port)['lorm_client_samples_total{phase="train"}'] == 321
    with pytest.raises(OSError):
        with socket.create_connection(("127.0.0.2", port), timeout=5):
            pass
    wide = ClientMetrics().serve(0, "0.0.0.0")  # the flag still widens it, on request
    with socket.create_connection(("127.0.0.2", wide), timeout=5):
        pass


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device here")
def test_client_gpu_memory_metrics():
    metrics = ClientMetrics()
    device = torch.device("cuda", 0)
    metrics.watch_device(device)
    port = metrics.serve(0, "127.0.0.1")
    held = torch.empty(64 << 20, dtype=torch.uint8, device=device)  # 64 MiB
    got = scrape(port)
    assert got["lorm_client_gpu_memory_allocated_bytes"] >= held.numel()
    assert got["lorm_client_gpu_memory_max_allocated_bytes"] >= got["lorm_client_gpu_memory_allocated_bytes"]
