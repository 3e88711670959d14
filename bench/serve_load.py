"""lorm-serve under load, beside the same model's plain batched forward pass (the ceiling), in one run.

1. The model: an export of all-MiniLM-L6-v2 (``--backbone``, default ``minilm``) with a LoRA adapter of
   rank 5 on every target layer and a head over CLINC150's 150 intents, written with the coordinator's own
   export functions (random factors: the cost of a forward pass does not depend on their values), or
   ``--export DIR`` for a run's results/ directory.
2. The ceiling, in this process: ``serve.model.Classifier`` on batches of ``--batch`` sentences:
   tokenisation and forward pass ("tokenise+forward"), and the forward pass alone on sentences tokenised
   beforehand ("forward"); torch on ``--threads`` threads.
3. The server: a ``lorm-serve`` process (``--max-batch`` = ``--batch``, torch on ``--threads`` threads,
   mutual TLS with a development CA unless ``--insecure``) and, in this process, ``--clients`` concurrent
   callers on keep-alive connections, each sending one CLINC150 test sentence per request and the next as
   soon as the answer is in. Reported: requests (= sentences) per second, latency p50 and p99, and the
   batch sizes the server ran.

The phases alternate, ``--rounds`` times: forward, tokenise+forward, then the server under load (after
``--warmup`` seconds of load), ``--seconds`` each; each round's ratio ceiling / served compares windows a
few seconds apart, so a machine whose other load drifts affects both sides of it alike. The medians are
reported with every round's figures.

Everything shares this machine's CPUs: the callers' own work (TLS, JSON, HTTP) competes with the server's,
as it would not in a deployment with callers elsewhere. The load average is printed at the start and end.

Run: .venv/bin/python bench/serve_load.py [--clients 64] [--seconds 30] [--batch 32] [--threads 2] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import ssl
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from client.backbones import build_model, model_spec  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.wire.messages import LowRank  # noqa: E402
from serve.model import Classifier  # noqa: E402
from server.certs import create_dev_pki  # noqa: E402
from server.export import export_adapter, export_card, export_head, model_card  # noqa: E402

RANK = 5  # LoRM's merged adapter after 5 tasks of rank 1 (the paper's CLINC150 split)


def clinc150(data_dir: Path) -> tuple[list[str], list[str]]:
    """CLINC150's test sentences and its 150 intents sorted (the paper's order)."""
    rows = json.loads((data_dir / "clinc150" / "data_full.json").read_text())
    return [text for text, _ in rows["test"]], sorted({intent for _, intent in rows["train"]})


def make_export(out: Path, backbone: str, classes: list[str], max_length: int) -> Path:
    """A LoRM-shaped export of ``backbone``: random rank-5 factors on every target layer, a random head."""
    config = RunConfig(
        run_id="serve-bench",
        dataset="textfile",
        backbone=backbone,
        max_length=max_length,
        num_tasks=5,
        settings={"data": {"classes": classes}},
    )
    spec = model_spec(build_model(config, len(classes)))
    gen = torch.Generator().manual_seed(0)
    adapter = {
        name: LowRank(torch.randn(d_out, RANK, generator=gen) / 100, torch.randn(RANK, d_in, generator=gen) / 100)
        for name, (d_out, d_in) in spec.layers.items()
    }
    head_w = torch.randn(len(classes), spec.feature_dim, generator=gen)
    export_adapter(out / "adapter", adapter, spec, rank_per_task=1)
    export_head(out, head_w, torch.zeros(len(classes)))
    export_card(out, model_card(config, spec, head_w, weights="adapter", tasks_trained=5, parts=[]))
    return out


class Ceiling:
    """The plain batched model in this process: sentences per second, tokenise+forward or forward alone."""

    def __init__(self, export: Path, sentences: list[str], batch: int) -> None:
        self.model = Classifier(export, device="cpu")
        self.batch = batch
        self.batches = [sentences[i : i + batch] for i in range(0, len(sentences) - batch + 1, batch)]
        self.encoded = [self.model.encode(b) for b in self.batches]
        self.model.probabilities(self.encoded[0])  # warm-up

    def rate(self, tokenise: bool, seconds: float) -> float:
        done, start, k = 0, time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            i = k % len(self.batches)
            self.model.probabilities(self.model.encode(self.batches[i]) if tokenise else self.encoded[i])
            done, k = done + self.batch, k + 1
        return done / (time.perf_counter() - start)


class Load:
    """``clients`` callers, each on its own keep-alive connection, one sentence per request."""

    def __init__(self, port: int, tls: ssl.SSLContext | None, sentences: list[str]) -> None:
        self.port, self.tls, self.sentences = port, tls, sentences
        self.latencies: list[float] = []
        self.errors = 0

    def request(self, text: str) -> bytes:
        body = json.dumps({"inputs": [text]}).encode()
        head = (
            f"POST /v1/predict HTTP/1.1\r\nHost: bench\r\nContent-Type: application/json\r\nContent-Length: {len(body)}"
        )
        return head.encode() + b"\r\n\r\n" + body

    async def caller(self, index: int, start: float, stop: float) -> None:
        reader, writer = await asyncio.open_connection(
            "127.0.0.1", self.port, ssl=self.tls, server_hostname="localhost" if self.tls else None
        )
        k = index
        try:
            while (now := time.perf_counter()) < stop:
                writer.write(self.request(self.sentences[k % len(self.sentences)]))
                head = await reader.readuntil(b"\r\n\r\n")
                length = int(re.search(rb"(?i)content-length: *(\d+)", head).group(1))  # type: ignore[union-attr]
                await reader.readexactly(length)
                if not head.startswith(b"HTTP/1.1 200"):
                    self.errors += 1
                if now >= start:
                    self.latencies.append(time.perf_counter() - now)
                k += 97  # another sentence each time, spread over the split
        finally:
            writer.close()

    async def run(self, clients: int, warmup: float, seconds: float) -> None:
        begin = time.perf_counter()
        start, stop = begin + warmup, begin + warmup + seconds
        await asyncio.gather(*(self.caller(i, start, stop) for i in range(clients)))


def serve_process(export: Path, pki_dir: Path | None, batch: int, threads: int, wait_ms: float) -> tuple[Any, int]:
    tls = (
        [
            "--tls-ca",
            str(pki_dir / "ca.crt"),
            "--tls-cert",
            str(pki_dir / "coordinator.crt"),
            "--tls-key",
            str(pki_dir / "coordinator.key"),
            "--allowed-clients",
            "bench",
        ]
        if pki_dir
        else ["--insecure"]
    )
    cmd = [sys.executable, "-m", "serve.main", "--models", str(export), "--port", "0", "--max-batch", str(batch)]
    cmd += ["--max-wait-ms", str(wait_ms), "--threads", str(threads), "--poll-s", "0", *tls]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env, cwd=ROOT)
    assert proc.stdout is not None
    for line in proc.stdout:
        found = re.search(r"listening on https?://127\.0\.0\.1:(\d+)", line)
        if found:
            return proc, int(found.group(1))
    raise RuntimeError(f"lorm-serve exited with {proc.wait()} before listening")


def get_json(port: int, tls: ssl.SSLContext | None, path: str) -> tuple[int, dict]:
    import http.client

    conn: http.client.HTTPConnection = (
        http.client.HTTPSConnection("localhost", port, context=tls)
        if tls
        else http.client.HTTPConnection("127.0.0.1", port)
    )
    conn.request("GET", path)
    response = conn.getresponse()
    return response.status, json.loads(response.read())


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=64, help="concurrent callers")
    parser.add_argument("--rounds", type=int, default=5, help="rounds of the three phases")
    parser.add_argument("--seconds", type=float, default=10.0, help="measured seconds of each phase, each round")
    parser.add_argument("--warmup", type=float, default=2.0, help="seconds of load before each measured window")
    parser.add_argument("--batch", type=int, default=32, help="the ceiling's batch and the server's --max-batch")
    parser.add_argument("--max-wait-ms", type=float, default=5.0, help="the server's --max-wait-ms")
    parser.add_argument("--threads", type=int, default=2, help="torch threads, ceiling and server alike")
    parser.add_argument("--max-length", type=int, default=32, help="tokens per sentence (the demo preset's 32)")
    parser.add_argument("--backbone", default="minilm")
    parser.add_argument("--export", type=Path, help="a run's export instead of the synthetic one")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("LORM_DATA_DIR", ROOT.parent / "shared/datasets"))
    )
    parser.add_argument("--insecure", action="store_true", help="plain HTTP instead of mutual TLS")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sentences, classes = clinc150(args.data_dir)
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        export = args.export or make_export(Path(tmp) / "export", args.backbone, classes, args.max_length)
        load_before = os.getloadavg()[0]
        top = Ceiling(export, sentences, args.batch)
        pki_dir = None if args.insecure else Path(tmp) / "tls"
        context = None
        if pki_dir is not None:
            pki = create_dev_pki(pki_dir, ["bench"])
            context = ssl.create_default_context(cafile=str(pki.ca))
            context.load_cert_chain(str(pki.client_cert("bench")), str(pki.client_key("bench")))
        proc, port = serve_process(export, pki_dir, args.batch, args.threads, args.max_wait_ms)
        rounds: list[dict[str, float]] = []
        load = Load(port, context, sentences)
        try:
            while True:
                try:
                    if get_json(port, context, "/health")[0] == 200:
                        break
                except OSError:
                    pass
                time.sleep(0.5)
            for _ in range(args.rounds):
                forward, tokenise = top.rate(False, args.seconds), top.rate(True, args.seconds)
                answered = len(load.latencies)
                asyncio.run(load.run(args.clients, args.warmup, args.seconds))
                served = (len(load.latencies) - answered) / args.seconds
                rounds.append({"forward": forward, "tokenise+forward": tokenise, "served": served})
            sizes = {int(k): v for k, v in get_json(port, context, "/v1/model")[1]["batch_sizes"].items()}
        finally:
            proc.terminate()
            proc.wait(30)

    def median(key: str) -> float:
        return round(float(np.median([r[key] for r in rounds])), 1)

    def ratio(key: str) -> float:
        return round(float(np.median([r[key] / r["served"] for r in rounds])), 2)

    lat = np.array(load.latencies) * 1000
    result = {
        "clients": args.clients,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "batch": args.batch,
        "threads": args.threads,
        "max_length": args.max_length,
        "tls": not args.insecure,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "per_round": [{k: round(v, 1) for k, v in r.items()} for r in rounds],
        "ceiling_forward_per_s": median("forward"),
        "ceiling_tokenise_forward_per_s": median("tokenise+forward"),
        "served_per_s": median("served"),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "errors": load.errors,
        "mean_batch": round(sum(k * v for k, v in sizes.items()) / max(1, sum(sizes.values())), 1),
        "ratio_forward": ratio("forward"),
        "ratio_tokenise_forward": ratio("tokenise+forward"),
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{args.backbone}, max_length {args.max_length}, batch {args.batch}, {args.threads} torch threads, "
        f"{args.rounds} rounds of {args.seconds:g} s per phase; load average {result['load_average'][0]} at the "
        f"start, {result['load_average'][1]} at the end"
    )
    print("round   forward/s   tokenise+forward/s   served/s")
    for i, r in enumerate(rounds):
        print(f"{i:5d} {r['forward']:11.1f} {r['tokenise+forward']:20.1f} {r['served']:10.1f}")
    print(
        f"median {result['ceiling_forward_per_s']:10.1f} {result['ceiling_tokenise_forward_per_s']:20.1f} "
        f"{result['served_per_s']:10.1f}"
    )
    print(
        f"lorm-serve, {args.clients} callers ({'mutual TLS' if result['tls'] else 'plain HTTP'}): "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, mean batch {result['mean_batch']}, "
        f"errors {load.errors}"
    )
    print(
        f"ceiling / served, median of the rounds: {result['ratio_forward']} (forward), "
        f"{result['ratio_tokenise_forward']} (tokenise+forward)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
