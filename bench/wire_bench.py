"""Bytes on the wire per client per round at ViT-B/16 shapes, through the real gRPC service.

Shapes: 12 blocks x LoRA layers qkv (2304, 768), proj (768, 768), fc1 (3072, 768),
fc2 (768, 3072) as (d_out, d_in); rank r = 16; head 100 classes x 768 features. Updates are
what a client sends with backbone gamma = 0: the trained factor (float32), diag(G) per layer
(float64), the head weight and bias (float32) and the full 768 x 768 head Gram (float64).
Plans are what the coordinator's LoRM strategy publishes (its factors are float64).

A real coordinator (``server.coordinator.Coordinator``, one client, tiny run) is served by
``server.service.create_server`` on 127.0.0.1, port 0; a real ``client.transport.CoordinatorClient``
pulls and pushes. Three counts per call:

  raw        sum of the tensors' nbytes (the payload itself)
  grpc msgs  sum over the stream's messages of ByteSize() + 5 (gRPC's length prefix)
  wire       TCP payload bytes in both directions, counted by a byte-counting TCP relay
             between the client's channel and the server: HTTP/2 frame headers, HPACK
             headers, SETTINGS / WINDOW_UPDATE / PING frames included; IP/TCP headers not
  lo iface   bytes on the loopback interface (/proc/net/dev via psutil) during a second,
             direct pass without the relay: adds IP/TCP headers and ACKs; the machine's
             loopback was idle otherwise (checked before the pass)

"Paper code" is what the public reference implementation hands the server per client per
round: both LoRA factors (float32) and a dense float32 Gram (d_in x d_in) for every LoRA
layer, plus the head weight, bias and dense float32 head Gram.

Run: .venv/bin/python bench/wire_bench.py
"""

from __future__ import annotations

import socket
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TypeVar

import psutil
import torch
from google.protobuf.message import Message

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.synthetic import CLASSES, FEATURES, LAYERS  # noqa: E402
from bench.synthetic import VIT_B16 as SPEC
from client.transport import CoordinatorClient  # noqa: E402
from common.infra.tls import Security  # noqa: E402
from common.run.config import RunConfig  # noqa: E402
from common.wire.instructions import LoraStep
from common.wire.messages import ClientUpdate, EvalReport, Phase, RoundPlan
from common.wire.tensors import head_tensors, pack  # noqa: E402
from proto import codec, streams  # noqa: E402
from server.coordinator import Coordinator  # noqa: E402
from server.service import create_server  # noqa: E402

RANK = 16
CONFIG = RunConfig(run_id="wire", num_clients=1, num_tasks=2, rounds_per_task=2, rank=RANK, seed=1)
GOAL = 1.05
T = TypeVar("T")
IO_TIMEOUT_S = 60.0  # a relay socket idle this long is closed (bounds every loop)


# ----------------------------------------------------------------------------- byte-counting relay


class CountingRelay:
    """A TCP relay on 127.0.0.1:0 to ``target_port`` that counts the bytes it forwards."""

    def __init__(self, target_port: int) -> None:
        self.target_port = target_port
        self.up = 0  # client -> server
        self.down = 0  # server -> client
        self.lock = threading.Lock()
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.port = self.listener.getsockname()[1]
        self.stopped = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        self.listener.settimeout(0.5)
        while not self.stopped.is_set():
            try:
                client, _ = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            server = socket.create_connection(("127.0.0.1", self.target_port), timeout=IO_TIMEOUT_S)
            client.settimeout(IO_TIMEOUT_S)
            for src, dst, attr in ((client, server, "up"), (server, client, "down")):
                threading.Thread(target=self._pump, args=(src, dst, attr), daemon=True).start()

    def _pump(self, src: socket.socket, dst: socket.socket, attr: str) -> None:
        try:
            while not self.stopped.is_set():
                data = src.recv(1 << 20)
                if not data:
                    break
                dst.sendall(data)
                with self.lock:
                    setattr(self, attr, getattr(self, attr) + len(data))
        except OSError:
            pass
        finally:
            for s in (src, dst):
                try:
                    s.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass

    def counts(self) -> tuple[int, int]:
        with self.lock:
            return self.up, self.down

    def close(self) -> None:
        self.stopped.set()
        self.listener.close()


def lo_bytes() -> int:
    """Bytes sent on the loopback interface (every packet there is sent once and received once)."""
    return psutil.net_io_counters(pernic=True)["lo"].bytes_sent


# ----------------------------------------------------------------------------- payloads


def update_for(plan: RoundPlan, gen: torch.Generator) -> ClientUpdate:
    """A client's update answering ``plan``, random values of the real shapes and dtypes."""
    step = plan.expect(LoraStep)
    factors: dict[str, dict[str, torch.Tensor]] = {}
    for name, (d_out, d_in) in LAYERS.items():
        shapes = {"B": (d_out, RANK), "A": (RANK, d_in)}
        factors[name] = {f: torch.randn(shapes[f], generator=gen) for f in step.train_factors}
    grams = {name: torch.rand(d_in, generator=gen, dtype=torch.float64) * 100 for name, (_, d_in) in LAYERS.items()}
    x = torch.randn(256, FEATURES, generator=gen, dtype=torch.float64)
    head = (
        head_tensors(torch.randn(CLASSES, FEATURES, generator=gen), torch.randn(CLASSES, generator=gen))
        if step.send_head
        else {}
    )
    tensors = pack(factors=factors, grams=grams, head=head, head_gram=x.T @ x if step.head_gram else None)
    return ClientUpdate.of_step(plan, 0, "c0", 500, tensors, 0.5)


def update_raw(update: ClientUpdate) -> int:
    return update.nbytes


def plan_raw(plan: RoundPlan) -> int:
    return sum(t.numel() * t.element_size() for t in plan.tensors.values())


def grpc_bytes(messages: Iterable[Message]) -> int:
    return sum(m.ByteSize() + 5 for m in messages)  # 5 = compressed flag + 4-byte length


def paper_code_bytes() -> dict[str, int]:
    """Per client per round in the reference code: both factors + dense Grams, all float32."""
    factors = sum((d_out * RANK + RANK * d_in) * 4 for d_out, d_in in LAYERS.values())
    grams = sum(d_in * d_in * 4 for _, d_in in LAYERS.values())
    head = (CLASSES * FEATURES + CLASSES + FEATURES * FEATURES) * 4
    return {"factors": factors, "grams": grams, "head": head, "total": factors + grams + head}


# ----------------------------------------------------------------------------- one pass


def run_pass(via_relay: bool) -> list[dict]:
    """Join, then pull/push every step of task 0 and pull task 1's first plan; one row per call."""
    rows: list[dict] = []
    gen = torch.Generator().manual_seed(0)
    with tempfile.TemporaryDirectory(prefix="lorm-wire-") as state:
        coordinator = Coordinator(CONFIG, state, on_event=lambda _: None)
        server, port = create_server(coordinator, "127.0.0.1:0", security=Security(insecure=True))
        server.start()
        relay = CountingRelay(port) if via_relay else None
        client = CoordinatorClient(f"127.0.0.1:{relay.port if relay else port}", "c0", security=Security(insecure=True))
        try:
            client.join(0)
            client.describe(SPEC)

            def measured(label: str, call: Callable[[], T], raw: int, msgs: int | None) -> T:
                up0, down0 = relay.counts() if relay else (0, 0)
                lo0, t0 = lo_bytes(), time.perf_counter()
                result = call()
                seconds = time.perf_counter() - t0
                time.sleep(0.2)  # let the last ACKs and window updates land before reading counters
                up1, down1 = relay.counts() if relay else (0, 0)
                rows.append(
                    {
                        "label": label,
                        "raw": raw,
                        "msgs": msgs,
                        "up": up1 - up0,
                        "down": down1 - down0,
                        "lo": lo_bytes() - lo0,
                        "seconds": seconds,
                    }
                )
                return result

            def pull(label: str) -> RoundPlan:
                plan = measured(label, client.pull, 0, None)
                assert isinstance(plan, RoundPlan), plan
                rows[-1]["raw"] = plan_raw(plan)
                rows[-1]["msgs"] = grpc_bytes(codec.plan_to_proto(plan))
                return plan

            def push(label: str, plan: RoundPlan) -> None:
                update = update_for(plan, gen)
                key = f"wire/{plan.task}/{plan.round}/{plan.phase.value}/0"
                msgs = grpc_bytes(codec.update_to_proto(update, key))
                measured(label, lambda: client.push(update, key), update_raw(update), msgs)

            plan = pull("plan, B-round (task 0)")
            push("update, B-round", plan)
            plan = pull("plan, A-round (task 0)")
            push("update, A-round", plan)
            plan = pull("plan, task Gram (task 0)")
            assert plan.phase == Phase.TASK_GRAM
            push("update, task Gram (end of task)", plan)
            plan = pull("plan, evaluate (task 0)")
            assert plan.phase == Phase.EVALUATE
            client.report(EvalReport(plan.run_id, "c0", 0, plan.task, [1], [2]), "wire/eval/0")
            plan = pull("plan, B-round (task 1, + task 0 delta)")
            assert plan.task == 1
        finally:
            client.close()
            if relay:
                relay.close()
            server.stop(grace=1).wait()
    return rows


# ----------------------------------------------------------------------------- report


def mb(n: int) -> str:
    return f"{n / 1e6:10.3f}"


def main() -> int:
    idle0 = lo_bytes()
    time.sleep(1.0)
    idle = lo_bytes() - idle0
    relayed = run_pass(via_relay=True)
    direct = run_pass(via_relay=False)
    print(
        f"ViT-B/16 shapes: {len(LAYERS)} LoRA layers, r = {RANK}, head {CLASSES} x {FEATURES}; "
        f"chunk {streams.DEFAULT_CHUNK_BYTES} B; loopback idle traffic before the passes: {idle} B/s"
    )
    print(
        "MB = 10^6 bytes. wire = TCP payload both directions through the relay; "
        "lo = loopback interface bytes, direct pass.\n"
    )
    header = (
        f"{'call':40s} {'raw MB':>10s} {'grpc MB':>10s} {'wire MB':>10s} {'wire/raw':>9s} "
        f"{'lo MB':>10s} {'lo/raw':>7s} {'s':>6s}"
    )
    print(header)
    print("-" * len(header))
    for row, d in zip(relayed, direct):
        wire = row["up"] + row["down"]
        flag = "" if wire / row["raw"] <= GOAL else "  > goal"
        print(
            f"{row['label']:40s} {mb(row['raw'])} {mb(row['msgs'])} {mb(wire)} {wire / row['raw']:9.4f} "
            f"{mb(d['lo'])} {d['lo'] / row['raw']:7.4f} {row['seconds']:6.2f}{flag}"
        )
    by_label = {row["label"]: row for row in relayed}
    b_update, a_update = by_label["update, B-round"], by_label["update, A-round"]
    b_plan, a_plan = by_label["plan, B-round (task 0)"], by_label["plan, A-round (task 0)"]
    paper = paper_code_bytes()
    print(
        f"\nPaper code per client per round (upload, analytic): factors B+A f32 {mb(paper['factors']).strip()} MB "
        f"+ dense Grams f32 {mb(paper['grams']).strip()} MB + head (w, b, dense Gram) f32 "
        f"{mb(paper['head']).strip()} MB = {mb(paper['total']).strip()} MB"
    )
    print(f"\n{'per client per round':40s} {'ours wire MB':>13s} {'paper MB':>10s} {'ours/paper':>11s}")
    for label, row in (("upload, B-round", b_update), ("upload, A-round", a_update)):
        wire = row["up"] + row["down"]
        print(f"{label:40s} {mb(wire):>13s} {mb(paper['total'])} {wire / paper['total']:11.4f}")
    for label, up, down in (
        ("upload + download, B-round", b_update, b_plan),
        ("upload + download, A-round", a_update, a_plan),
    ):
        wire = up["up"] + up["down"] + down["up"] + down["down"]
        print(f"{label:40s} {mb(wire):>13s} {'':>10s} {'':>11s}")
    factors32 = sum((d_out + d_in) * RANK * 4 for d_out, d_in in LAYERS.values())
    head32 = (CLASSES * FEATURES + CLASSES) * 4
    print(
        "\nplan raw at task t (analytic: float32 current factors + task deltas of rank t*r + head): "
        + ", ".join(f"t={t}: {mb(factors32 * (1 + t) + head32).strip()} MB" for t in (0, 1, 9))
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
