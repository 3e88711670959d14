"""lorm-serve under load, beside the same model's plain batched forward pass (the ceiling), in one run.

1. The model: an export of all-MiniLM-L6-v2 (``--backbone``, default ``minilm``) with a LoRA adapter of
   rank 5 on every target layer and a head over CLINC150's 150 intents, written with the coordinator's own
   export functions (random factors: the cost of a forward pass does not depend on their values); or, with
   ``--cell NAME``, the export of a real run of a cell of ``bench/clinc150_methods.json`` (its backbone and method
   settings: e.g. ``ridge@3layers+valx4avg``) on ``--per-class`` training sentences of each of CLINC150's 150
   intents in one task, with a fixed lambda (the cost of scoring depends on the head's shape, 150 x F', not on
   its values or on how lambda was chosen); or ``--export DIR`` for a run's results/ directory. Its size on disk
   is printed, file by file.
2. The ceiling, in this process: the same backbone's plain batched forward pass on batches of ``--batch``
   sentences tokenised beforehand ("backbone": ``client.backbone_builders.build_backbone``, its pooled features, no
   adapter, no head), and the export's whole scoring (``serve.model.Classifier``, the method's scoring path: the
   feature map, the projection, the head) with tokenisation ("tokenise+score") and without ("score"); torch on
   ``--threads`` threads.
3. The server: a ``lorm-serve`` process (``--max-batch`` = ``--batch``, torch on ``--threads`` threads,
   mutual TLS with a development CA unless ``--insecure``) and, in this process, ``--clients`` concurrent
   callers on keep-alive connections, each sending one CLINC150 test sentence per request and the next as
   soon as the answer is in. Reported: requests (= sentences) per second, latency p50 and p99, and the
   batch sizes the server ran.

The phases alternate, ``--rounds`` times: backbone, score, tokenise+score, then the server under load (after
``--warmup`` seconds of load), ``--seconds`` each; each round's ratio ceiling / served compares windows a
few seconds apart, so a machine whose other load drifts affects both sides of it alike. The medians are
reported with every round's figures.

Everything shares this machine's CPUs: the callers' own work (TLS, JSON, HTTP) competes with the server's,
as it would not in a deployment with callers elsewhere. The load average is printed at the start and end.

Run: .venv/bin/python bench/serve_load.py [--cell NAME] [--clients 64] [--seconds 30] [--batch 32] [--threads 2]
[--json]
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

from client.backbone_builders import build_backbone  # noqa: E402
from client.classifier import build_model, model_spec  # noqa: E402
from client.scoring import trimmed  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.wire.messages import LowRank  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from serve.model import Classifier  # noqa: E402
from server.certs import create_dev_pki  # noqa: E402
from server.export import export_adapter, export_card, export_head, model_card  # noqa: E402

RANK = 5  # LoRM's merged adapter after 5 tasks of rank 1 (the paper's CLINC150 split)
PHASES = ("backbone", "score", "tokenise+score")  # the ceiling's, in this process


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


def cell_export(
    out: Path, cell: str, data_dir: Path, per_class: int, max_length: int, backbone: str | None = None
) -> Path:
    """The export of a real run of ``cell`` (bench/clinc150_methods.json: its backbone, or ``backbone``, and its
    method settings) on ``per_class`` training sentences of each CLINC150 intent, one task, one client, lambda
    fixed."""
    recipe = json.loads((ROOT / "bench" / "clinc150_methods.json").read_text())[cell]
    method = cell.split("@")[0]
    settings = {k: v for k, v in recipe.get("settings", {}).items() if k != "data"}  # train_val: more of the same
    settings["ridge"] = {**settings.get("ridge", {}), "fixed_lambda": 1e5, "holdout": 0}
    config = RunConfig(
        run_id=f"serve-bench-{cell}",
        dataset="clinc150",
        data_dir=str(data_dir),
        backbone=backbone or recipe.get("backbone", "minilm"),
        method=method,
        num_tasks=1,
        num_clients=1,
        train_per_class=per_class,
        test_per_class=1,
        max_length=max_length,
        threads=torch.get_num_threads(),
        settings=settings,
    )
    run_inprocess(config, results_dir=out)
    return out


def sizes_on_disk(export: Path) -> dict[str, int]:
    """Bytes of each file of the export (its task-<t>/ copies left out), and their total."""
    files = {p.relative_to(export).as_posix(): p.stat().st_size for p in sorted(export.rglob("*")) if p.is_file()}
    kept = {k: v for k, v in files.items() if not k.startswith(("task-", "tensorboard/"))}
    return kept | {"total": sum(kept.values())}


class Ceiling:
    """In this process: the backbone's plain batched forward pass, and the export's scoring with tokenisation and
    without; sentences per second."""

    def __init__(self, export: Path, sentences: list[str], batch: int) -> None:
        self.model = Classifier(export, device="cpu")
        card = self.model.card
        plain = RunConfig(backbone=card.backbone.name, model_seed=card.backbone.model_seed)
        self.backbone = build_backbone(plain.replace(max_length=card.preprocessing.max_length or 1)).eval()
        self.batch = batch
        self.batches = [sentences[i : i + batch] for i in range(0, len(sentences) - batch + 1, batch)]
        self.encoded = [self.model.encode(b) for b in self.batches]
        self.model.probabilities(self.encoded[0])  # warm-up
        self.plain(self.encoded[0])

    @torch.inference_mode()
    def plain(self, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        return self.backbone(**trimmed(inputs))  # (batch, feature_dim), the batch's padding trimmed as served

    def rate(self, phase: str, seconds: float) -> float:
        done, start, k = 0, time.perf_counter(), 0
        while time.perf_counter() - start < seconds:
            i = k % len(self.batches)
            if phase == "backbone":
                self.plain(self.encoded[i])
            else:
                self.model.probabilities(
                    self.model.encode(self.batches[i]) if phase == "tokenise+score" else self.encoded[i]
                )
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
    parser.add_argument("--backbone", help="the synthetic export's (default minilm), or instead of the cell's")
    parser.add_argument("--export", type=Path, help="a run's export instead of the synthetic one")
    parser.add_argument("--cell", help="export a real run of this bench/clinc150_methods.json cell instead")
    parser.add_argument("--per-class", type=int, default=2, help="--cell: training sentences per intent")
    parser.add_argument(
        "--data-dir", type=Path, default=Path(os.environ.get("LORM_DATA_DIR", ROOT.parent / "shared/datasets"))
    )
    parser.add_argument("--insecure", action="store_true", help="plain HTTP instead of mutual TLS")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    sentences, classes = clinc150(args.data_dir)
    with tempfile.TemporaryDirectory(prefix="serve-bench-") as tmp:
        if args.export:
            export = args.export
        elif args.cell:
            export = cell_export(
                Path(tmp) / "export", args.cell, args.data_dir, args.per_class, args.max_length, args.backbone
            )
        else:
            export = make_export(Path(tmp) / "export", args.backbone or "minilm", classes, args.max_length)
        on_disk = sizes_on_disk(export)
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
                rates = {phase: top.rate(phase, args.seconds) for phase in PHASES}
                answered = len(load.latencies)
                asyncio.run(load.run(args.clients, args.warmup, args.seconds))
                rounds.append(rates | {"served": (len(load.latencies) - answered) / args.seconds})
            sizes = {int(k): v for k, v in get_json(port, context, "/v1/model")[1]["batch_sizes"].items()}
        finally:
            proc.terminate()
            proc.wait(30)

    def median(key: str) -> float:
        return round(float(np.median([r[key] for r in rounds])), 1)

    def ratio(key: str) -> float:
        return round(float(np.median([r[key] / r["served"] for r in rounds])), 2)

    lat = np.array(load.latencies) * 1000
    card = top.model.card
    result = {
        "export": {"method": card.method, "backbone": card.backbone.name, "cell": args.cell, "bytes": on_disk},
        "clients": args.clients,
        "rounds": args.rounds,
        "seconds": args.seconds,
        "batch": args.batch,
        "threads": args.threads,
        "max_length": args.max_length,
        "tls": not args.insecure,
        "load_average": [round(load_before, 1), round(os.getloadavg()[0], 1)],
        "per_round": [{k: round(v, 1) for k, v in r.items()} for r in rounds],
        **{f"{phase}_per_s": median(phase) for phase in PHASES},
        "served_per_s": median("served"),
        "p50_ms": round(float(np.percentile(lat, 50)), 1),
        "p99_ms": round(float(np.percentile(lat, 99)), 1),
        "errors": load.errors,
        "mean_batch": round(sum(k * v for k, v in sizes.items()) / max(1, sum(sizes.values())), 1),
        **{f"ratio_{phase}": ratio(phase) for phase in PHASES},
    }
    if args.json:
        print(json.dumps(result))
        return 0
    print(
        f"{card.method} on {card.backbone.name} ({args.cell or 'a LoRM-shaped export'}), max_length "
        f"{args.max_length}, batch {args.batch}, {args.threads} torch threads, {args.rounds} rounds of "
        f"{args.seconds:g} s per phase; load average {result['load_average'][0]} at the start, "
        f"{result['load_average'][1]} at the end"
    )
    print("export on disk: " + ", ".join(f"{name} {size / 1e6:.1f} MB" for name, size in on_disk.items()))
    print("round  backbone/s   score/s   tokenise+score/s   served/s")
    for i, r in enumerate(rounds):
        print(f"{i:5d} {r['backbone']:10.1f} {r['score']:9.1f} {r['tokenise+score']:18.1f} {r['served']:10.1f}")
    print(
        f"median {median('backbone'):9.1f} {median('score'):9.1f} {median('tokenise+score'):18.1f} "
        f"{median('served'):10.1f}"
    )
    print(
        f"lorm-serve, {args.clients} callers ({'mutual TLS' if result['tls'] else 'plain HTTP'}): "
        f"p50 {result['p50_ms']} ms, p99 {result['p99_ms']} ms, mean batch {result['mean_batch']}, "
        f"errors {load.errors}"
    )
    print(
        "ceiling / served, median of the rounds: "
        + ", ".join(f"{result['ratio_' + phase]} ({phase})" for phase in PHASES)
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
