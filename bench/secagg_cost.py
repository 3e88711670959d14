"""What secure aggregation costs per step, in each mode and on each graph: wall time, bytes per client, the
coordinator's memory and disk, and a cost model fitted to them.

For each training step of a method's first task (LoRM: the B-round, the A-round and the task Gram; ``--steps``
picks some) on a real model's shapes, ``K`` clients with made-up updates of the step's declared shapes, in
three modes:

- ``plain``: no secure aggregation. Each client uploads its update; the coordinator checks and folds every
  update, then merges.
- ``honest``: against a curious coordinator. Every round of ``common/secagg/rounds.py``: keys with a
  commitment to the own-mask seed, sealed shares, masked inputs, then the unmask answers of every survivor
  (the coordinator waits for all of them, so that a wrong share can be named). The coordinator adds the
  masked inputs, rebuilds and checks the secrets, removes the masks, loads the sum and merges.
- ``signed``: against a coordinator that deviates (``secagg.mode = signed``). The advertised keys also
  carry the client's certificate (ECDSA P-256, from a development PKI: ``server/certs.py``) and its
  signature; every client verifies its roster against the CA before sharing. A consistency round
  sits before the unmask: every survivor signs the request, and verifies the signatures it is shown (its
  closed neighbourhood's) before revealing anything.

and, for each secure mode, on each ``--graph``: ``complete`` (every client shares with and masks against every
other, ``k = K - 1``) or ``sparse`` (SecAgg+: ``common/secagg/graph.py``'s Harary graph, ``k`` neighbours and a
threshold ``t`` per closed neighbourhood, sized for ``--dropout-target`` and ``--corrupt-target``; at a ``K``
too small for a sparse graph, ``k = K - 1``, the complete graph). Each client draws the step's graph itself
(``step_graph``: its time is counted for every client and for the coordinator), receives its neighbourhood's
roster (``ServerSession.roster_for``) and, signed, its closed neighbourhood's confirmations.

``--dropped`` clients (a share of ``K``: the last indices, so random ring positions on the sparse graph) vanish
after sharing their keys; in ``plain`` they send nothing.

Figures per (step, graph, mode, K, dropped):

- client s: the slowest client's compute over the whole step (drawing the graph, its terms, keys, shares, mask,
  signatures and answers; no local training, which every mode shares), and the median client's (the slowest
  is the first a busy host's pauses show in). Coordinator s: all its calls (rosters,
  inboxes and confirmations relayed per client included), each taking its own copy of the message, as decoding
  it off the wire would. Their sum is the step's wall time without the network, clients running in parallel.
  After the table, the coordinator's seconds by part: each call, and of the last turn the secrets' rebuild
  (``rebuild``), the masks' removal (``unmask``: seeds' and dropped clients' masks expanded again), ``load``
  and ``merge``.
- bytes a surviving client sends, per round (payloads, no framing): advertise (index, two X25519 keys, the
  seed commitment; signed: certificate and signature), share (one 160-byte sealed box per neighbour;
  signed: then the recipient's x-coordinate and the dealer's signature over the box's header),
  masked (16 bytes per entry), confirm (a signature) and unmask (an index and 16 bytes per surviving holder's
  seed share, an index and 32 per dropped neighbour's key share; signed: each with the box's header,
  x-coordinate and dealer's signature); and the mean a client receives (its roster, its inbox, the request,
  its confirmations).
- the coordinator's peak memory over the step, above what it held before (``tracemalloc``): its side of
  the step run again alone from a transcript of the messages it received, so that the times above are not
  slowed by tracing. Traced: Python objects and numpy arrays (keys, certificates, sealed shares, the masked
  ring sum, answers, the masks it rebuilds). Not traced: torch tensors, i.e. the step's running sums
  (printed per step; the same in every mode) and, ``plain``, the update being folded.
- disk MB: what the coordinator's persistence would write over the step (``common/secagg/persistence.py``):
  one JSON line (``session_record``) per advertise, share, confirm and reveal call, and the whole state
  (``session_state``) at each close (keys, shares, inputs) and once after the answers. Computed in a pass of
  its own over the transcript after the run, so that neither the times nor the traced peak include it; the
  staged masked inputs (16 bytes per entry per survivor, on every graph) are not counted.

The times are taken with the allocator held steady (:func:`steady_allocator`): every row, the first of a process
too, runs as a process's later steps would.

**Cost model** (after the table, per graph and secure mode, least squares over that group's rows; ``m`` the
neighbours per client: ``K - 1`` complete, ``k`` sparse; ``d`` the dropped clients):

- client s ``= c0 + c1 m`` and MB sent per client ``= c0 + c1 m``: a client's work is its own (terms, its own
  mask, fixed bytes) plus a share, a box, a pairwise mask and an answer per neighbour;
- coordinator s ``= c0 + c1 K + c2 K m + c3 d m``: per client its calls, per pair of neighbours the boxes it
  relays and the answers it checks, per (dropped, neighbour) pair the pairwise mask it expands again. A form is
  fitted only with a row to spare and terms the rows tell apart: else the first of ``c0 + c1 K m + c2 d m``,
  ``c0 + c1 K + c2 K m``, ``c0 + c1 K m``, ``c0`` that is (exactly determined when none has a row to spare; the
  form used is printed with its coefficients).

Each model is printed with its coefficients and its prediction at 10,000 clients (sparse: ``m`` =
``derive(10000, dropout_target, corrupt_target).k``; coordinator: at each ``--dropped`` share).

Usage (the model's shapes from a preset; CLINC150 needs LORM_DATA_DIR)::

    OMP_NUM_THREADS=1 python bench/secagg_cost.py --preset cpu-clinc150-quick --clients 10 50 100 --dropped 0 0.1
    OMP_NUM_THREADS=1 python bench/secagg_cost.py --clients 100 300 1000 --graph sparse --steps 'train B'

Prints one table row per (step, graph, mode, K, dropped), then the cost model; the figures in docs/BENCHMARKS.md
come from it. Runs too long for one command save their rows (``--save rows.jsonl``) and are fitted together after
(``--fit rows.jsonl ...``, with the same ``--dropped``, ``--dropout-target`` and ``--corrupt-target``).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import ctypes.util
import json
import statistics
import tempfile
import time
import tracemalloc
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from client.runtime import build_runtime
from common.aggregation.base import Aggregator
from common.merges.sums import running_sums
from common.methods.checks import validate
from common.run.config import RunConfig
from common.run.presets import preset
from common.run.settings import SecAggSettings
from common.secagg import server_session
from common.secagg.client_session import ClientSession
from common.secagg.graph import Graph, derive
from common.secagg.persistence import session_record, session_state
from common.secagg.primitives import FixedPoint, decode, encode
from common.secagg.rounds import Keys
from common.secagg.server_session import ServerSession
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import Layout, client_terms, context, fixed_point, pack, step_graph, unpack
from common.wire.messages import ClientUpdate, ModelSpec, RoundPlan
from common.wire.tensors import (
    FACTOR,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    parse_tensor_name,
)
from lab.secure_rounds import Timings
from server.certs import create_dev_pki
from server.secure import load_sums
from server.strategies import make_strategy
from server.strategies.base import Strategy

MODES = ("plain", "honest", "signed")
GRAPHS = ("complete", "sparse")
ROUNDS = ("advertise", "share", "masked", "confirm", "unmask")
RECEIVED = ("roster", "request", "confirmations", "inbox")
INDEX = 4  # a client index on the wire
RECORDED = ("advertise", "share", "confirm", "reveal")  # the calls whose record the coordinator appends to its log
CLOSES = ("close_keys", "close_shares", "close_inputs")  # the closes after which it writes its whole state
MODEL_AT = 10_000  # the cost model's predictions: at this many clients


def made_up_update(plan: RoundPlan, shapes: dict, index: int, samples: int = 50) -> ClientUpdate:
    g = torch.Generator().manual_seed(index)
    tensors = {}
    for name, shape in shapes.items():
        kind, _, _ = parse_tensor_name(name)
        if kind == GRAM or name == HEAD_GRAM:
            x = torch.randn(samples, shape[0], generator=g, dtype=torch.float64)
            tensors[name] = x.T @ x if len(shape) == 2 else (x * x).sum(0)
        elif kind == FACTOR or name in (HEAD_WEIGHT, HEAD_BIAS):
            tensors[name] = torch.randn(shape, generator=g) * 1e-2
    return ClientUpdate.of_step(plan, index, f"c{index}", samples, tensors, 1.0)


def own(message: Any) -> Any:
    """The coordinator's own copy of a client's message (bytes, keys, a ring vector, a dict of them; an index
    as is), as decoding it off the wire would allocate: what it keeps is then its memory, not the client's."""
    if isinstance(message, (bytes, bytearray)):
        return bytes(bytearray(message))
    if isinstance(message, np.ndarray):
        return message.copy()
    if isinstance(message, dict):
        return {k: own(v) for k, v in message.items()}
    if isinstance(message, tuple):
        return tuple(own(m) for m in message)
    if isinstance(message, Keys):
        k = message
        fields = (k.cipher_public, k.mask_public, k.commitment, k.certificate, k.signature)
        return Keys(k.index, *(own(b) for b in fields))
    if isinstance(message, int):
        return message
    raise TypeError(f"no copy for a {type(message).__name__}")


def keys_bytes(keys: Keys) -> int:
    fields = (keys.cipher_public, keys.mask_public, keys.commitment, keys.certificate, keys.signature)
    return INDEX + sum(len(b) for b in fields)


def confirmations_for(server: ServerSession, i: int) -> dict[int, bytes]:
    """The confirmations the coordinator relays to survivor ``i``: its closed neighbourhood's (all of them on the
    complete graph), which are the only ones ``i`` counts."""
    near = server.near(i)
    if near is None:
        return dict(server.confirmations)
    return {j: server.confirmations[j] for j in near if j in server.confirmations}


RELAYS: dict[str, Callable[..., Any]] = {"confirmations_for": confirmations_for}  # the bench's, not the session's


def call(server: ServerSession, name: str, message: tuple) -> Any:
    """The coordinator's call ``name`` of a transcript on ``message``: a session method or a relay of :data:`RELAYS`."""
    if name in RELAYS:
        return RELAYS[name](server, *message)
    return getattr(server, name)(*message)


@dataclass
class Step:
    """One secure step as it ran: per-client seconds and bytes (sent per round; received, the mean over the clients
    that received each), the coordinator's seconds (``clock.server``), and what it takes to run the coordinator's
    side again alone: its session's parameters (the graph among them), the fixed point, the layout and the
    transcript of its calls in order, each with the client's message it received."""

    session: dict[str, Any]
    fp: FixedPoint
    layout: Layout
    graph: Graph
    clock: Timings = field(default_factory=Timings)
    sent: dict[int, Counter] = field(default_factory=dict)
    received: dict[str, float] = field(default_factory=dict)
    transcript: list[tuple[str, tuple]] = field(default_factory=list)
    seconds: defaultdict[str, float] = field(default_factory=lambda: defaultdict(float))  # the coordinator's, by part


@contextlib.contextmanager
def timed_unmask(seconds: defaultdict[str, float]) -> Iterator[None]:
    """``ServerSession.result``'s removal of the masks (``primitives.unmask``: the survivors' own masks and the
    dropped clients' pairwise ones expanded again) timed apart, into ``seconds["unmask"]``."""
    original = server_session.unmask

    def unmask(*args: Any, **kwargs: Any) -> Any:
        start = time.perf_counter()
        try:
            return original(*args, **kwargs)
        finally:
            seconds["unmask"] += time.perf_counter() - start

    server_session.unmask = unmask
    try:
        yield
    finally:
        server_session.unmask = original


def finish(
    server: ServerSession, aggregator: Aggregator, step: Step, seconds: defaultdict[str, float] | None = None
) -> None:
    """The coordinator's last turn: rebuild and check the secrets, remove the masks, load the survivors' sum
    (``seconds``: each part's time added to it: ``rebuild`` the secrets, ``unmask``, ``load``)."""
    parts = defaultdict(float) if seconds is None else seconds
    survivors, _ = server.close_inputs()
    start = time.perf_counter()
    with timed_unmask(parts) if seconds is not None else contextlib.nullcontext():
        result = server.result()
    parts["rebuild"] += time.perf_counter() - start - parts["unmask"]
    start = time.perf_counter()
    total = decode(result, step.fp, len(survivors))
    load_sums(aggregator, unpack(step.layout.unflatten(total)), len(survivors), 16 * step.layout.size * len(survivors))
    parts["load"] += time.perf_counter() - start


def secure_run(
    aggregator: Aggregator,
    as_client: Strategy,
    updates: dict[int, ClientUpdate],
    settings: SecAggSettings,
    gone: tuple[int, ...],
    signers: dict[int, Signer] | None = None,
    verifier: Verifier | None = None,
) -> Step:
    """One step's secure aggregation among in-process clients, every round metered; the survivors' sum
    loaded into ``aggregator``. Signed when ``signers`` (one per client) and ``verifier`` (the run's CA) are given.
    On ``settings``' graph (``step_graph``: ``secagg.graph``, ``dropout``, ``corrupt``), which every party draws.

    The rounds are driven here rather than through ``lab.secure_rounds.secure_step``: the bench copies each
    message into the coordinator's memory, counts every field a client sends and records the coordinator's
    calls to replay them under ``tracemalloc`` (:func:`replay`), instrumentation that the engine's
    in-process step should not carry; that step stays exactly the honest protocol the engine runs."""
    clients, plan = len(updates), aggregator.plan
    ctx = context(plan)
    clock = Timings()
    start = time.perf_counter()
    graph = step_graph(settings, clients, ctx)
    drawn = time.perf_counter() - start  # every party draws the same graph from the context: each pays this
    clock.server += drawn
    sessions, terms = {}, {}
    for i, u in sorted(updates.items()):
        clock.client[i] = drawn
        with clock.of(i):
            terms[i] = pack(client_terms(as_client.aggregator(plan), u))
            sessions[i] = ClientSession(i, graph.threshold, ctx, (signers or {}).get(i), verifier, graph=graph)
    layout = Layout.of(terms[0])
    opened: dict[str, Any] = {
        "expected": list(range(clients)),
        "threshold": graph.threshold,
        "context": ctx,
        "size": layout.size,
        "graph": graph,
    }
    if verifier is not None:  # boxes and answers carry their dealers' signatures, checked on arrival
        opened |= {"signed": True, "check": verifier.verify}
    run = Step(opened, fixed_point(settings, clients), layout, graph, clock, {i: Counter() for i in updates})
    received: dict[int, Counter] = {i: Counter() for i in updates}
    run.seconds["graph"] = drawn
    with clock.of(None):
        server = ServerSession(**opened)

    def deliver(name: str, *message: Any) -> Any:
        """The coordinator's call ``name`` on (its own copy of) a client's ``message``, timed and recorded."""
        run.transcript.append((name, message))
        start = time.perf_counter()
        with clock.of(None):
            answer = call(server, name, own(message))
        run.seconds[name] += time.perf_counter() - start
        return answer

    for i, s in sessions.items():
        keys = s.advertise()
        run.sent[i]["advertise"] += keys_bytes(keys)
        deliver("advertise", keys)
    deliver("close_keys")
    for i, s in sessions.items():
        roster = deliver("roster_for", i)  # its neighbourhood's keys (everyone's on the complete graph)
        received[i]["roster"] = sum(keys_bytes(k) for k in roster.values())
        with clock.of(i):
            boxes = s.share(roster)
        run.sent[i]["share"] += sum(len(b) for b in boxes.values())
        deliver("share", i, boxes)
    sharers = deliver("close_shares")
    for i, s in sessions.items():
        if i not in gone:
            with clock.of(i):
                y = s.mask(encode(layout.flatten(terms[i]), run.fp), sharers)
            run.sent[i]["masked"] += y.nbytes
            deliver("masked_input", i, y)
    survivors, dropped = deliver("close_inputs")
    if verifier is not None:  # the consistency round
        for i in survivors:
            with clock.of(i):
                signature = sessions[i].confirm(survivors, dropped)
            run.sent[i]["confirm"] += len(signature)
            deliver("confirm", i, signature)
    for i in survivors:
        received[i]["request"] = INDEX * (len(survivors) + len(dropped))
        confirmations = None
        if verifier is not None:  # relayed as received: those of its closed neighbourhood
            confirmations = deliver("confirmations_for", i)
            received[i]["confirmations"] = sum(INDEX + len(s) for s in confirmations.values())
        inbox = deliver("inbox", i)
        received[i]["inbox"] = sum(len(b) for b in inbox.values())
        with clock.of(i):
            answer = sessions[i].reveal(inbox, survivors, dropped, confirmations)
        run.sent[i]["unmask"] += sum(INDEX + len(s) for s in answer.values())
        deliver("reveal", i, answer)
    for kind in RECEIVED:
        got = [c[kind] for c in received.values() if kind in c]
        run.received[kind] = statistics.mean(got) if got else 0.0
    with clock.of(None):
        finish(server, aggregator, run, run.seconds)
    return run


def replay(strategy: Strategy, plan: RoundPlan, step: Step) -> None:
    """The coordinator's side of ``step`` run again alone, from its transcript, on the step's graph, then the merge."""
    fold = strategy.fold(plan)
    server = ServerSession(**step.session)  # its graph among the session's parameters
    assert (server.graph or Graph.full(len(step.session["expected"]), server.threshold)).k == step.graph.k
    for name, message in step.transcript:
        call(server, name, own(message))
    finish(server, fold.aggregator, step)
    fold.finish()


def disk_bytes(step: Step) -> int:
    """What the coordinator's persistence writes over ``step``: a JSON line (:func:`session_record`, and its
    newline) per advertise, share, confirm and reveal call, and its whole state (:func:`session_state`) after each
    close and once after the answers. A pass of its own over the transcript (no masks removed, nothing traced or
    timed), so that serializing costs the timed and traced runs nothing."""
    server = ServerSession(**step.session)
    written = 0
    for name, message in step.transcript:
        call(server, name, message)
        if name in RECORDED:
            index = message[0].index if name == "advertise" else message[0]
            written += len(json.dumps(session_record(server, name, index))) + 1
        elif name in CLOSES:
            written += len(json.dumps(session_state(server)))
    return written + len(json.dumps(session_state(server)))


def plain(strategy: Strategy, plan: RoundPlan, updates: list[ClientUpdate]) -> None:
    """The coordinator without secure aggregation: check and fold every update, then merge."""
    fold = strategy.fold(plan)
    for u in updates:
        fold.aggregator.fold(u)
    fold.finish()


def traced_peak(work: Callable[[], None]) -> int:
    """The peak bytes ``tracemalloc`` sees while ``work`` runs: Python objects and numpy arrays it allocates
    (not torch tensors; nothing allocated before, such as a transcript's messages)."""
    tracemalloc.start()
    try:
        work()
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@dataclass
class Pki:
    """Each client's signer and the run's CA, from one development PKI made for the largest run."""

    signers: dict[int, Signer]
    verifier: Verifier


def dev_pki(clients: int, root: str) -> Pki:
    pki = create_dev_pki(root, [f"c{i}" for i in range(clients)])
    signers = {i: Signer.from_files(pki.client_cert(f"c{i}"), pki.client_key(f"c{i}")) for i in range(clients)}
    return Pki(signers, Verifier(pki.ca))


@dataclass(frozen=True)
class Sizing:
    """The sparse graph's targets (``secagg.dropout``, ``secagg.corrupt``) the rows' graphs are drawn for."""

    dropout: float = 0.1
    corrupt: float = 0.05

    def settings(self, mode: str, graph: str) -> SecAggSettings:
        return SecAggSettings(enabled=True, mode=mode, graph=graph, dropout=self.dropout, corrupt=self.corrupt)


def one_step(
    strategy: Strategy,
    plan: RoundPlan,
    updates: list[ClientUpdate],
    mode: str,
    gone: tuple[int, ...],
    pki: Pki | None,
    memory: bool = True,
    graph: str = "complete",
    sizing: Sizing = Sizing(),
) -> dict:
    """One (graph, mode, dropped) run of the step: its row's figures (``memory``: the coordinator's, measured again
    under ``tracemalloc`` after the timed run; else 0; its disk, in a pass of its own after that)."""
    survivors = [i for i in range(len(updates)) if i not in gone]
    if mode == "plain":
        uploads = [updates[i] for i in survivors]
        start = time.perf_counter()
        plain(strategy, plan, uploads)
        seconds = time.perf_counter() - start
        peak = traced_peak(lambda: plain(strategy, plan, uploads)) if memory else 0
        sent = statistics.mean(u.nbytes for u in uploads)
        return {"graph": "—", "k": None, "t": None, "client_s": 0.0, "client_median_s": 0.0} | {
            "coordinator_s": seconds,
            "per_round": {"masked": sent},
            "sent": sent,
            "received": 0.0,
            "peak": peak,
            "disk": 0,
        }
    fold = strategy.fold(plan)
    signers, verifier = (pki.signers, pki.verifier) if mode == "signed" and pki else (None, None)
    settings = sizing.settings(mode, graph)
    run = secure_run(fold.aggregator, strategy, dict(enumerate(updates)), settings, gone, signers, verifier)
    start = time.perf_counter()
    fold.finish()
    run.seconds["merge"] += time.perf_counter() - start
    coordinator_s = run.clock.server + run.seconds["merge"]
    per_round = {r: statistics.mean(run.sent[i][r] for i in survivors) for r in ROUNDS}
    return {
        "graph": graph,
        "k": run.graph.k,
        "t": run.graph.threshold,
        "client_s": max(run.clock.client.values()),
        "client_median_s": statistics.median(run.clock.client.values()),
        "coordinator_parts": dict(run.seconds),
        "coordinator_s": coordinator_s,
        "per_round": per_round,
        "sent": sum(per_round.values()),
        "received": float(sum(run.received.values())),
        "peak": traced_peak(lambda: replay(strategy, plan, run)) if memory else 0,
        "disk": disk_bytes(run),
    }


def measure(
    config: RunConfig,
    spec: ModelSpec,
    clients: int,
    dropped_shares: list[float],
    modes: list[str],
    pki: Pki | None,
    steps: list[str] | None = None,
    memory: bool = True,
    graphs: Sequence[str] = GRAPHS,
    sizing: Sizing = Sizing(),
) -> Iterator[dict]:
    """Rows of figures for each step of the first task (``steps``: those named, e.g. ``train B``): per dropped share,
    ``plain`` once, then each secure mode on each of ``graphs``."""
    strategy = make_strategy(config, spec)
    strategy.begin_task(0)
    seen = set()
    for phase, round_ in strategy.steps(0):
        plan = strategy.configure(0, round_, phase)
        name = f"{phase.value} {plan.instruction.factors()}".strip()
        if name in seen or (steps and name not in steps):  # a later B-round costs what the first did
            continue
        seen.add(name)
        shapes = strategy.aggregator(plan).expected()
        updates = [made_up_update(plan, shapes, i) for i in range(clients)]
        folded = strategy.aggregator(plan)
        folded.fold(updates[0])
        sums_mb = sum(t.numel() * t.element_size() for t in running_sums(folded).values()) / 1e6
        for share in dropped_shares:
            gone = tuple(range(clients - int(round(share * clients)), clients))
            runs = [("plain", "—")] if "plain" in modes else []
            runs += [(m, g) for g in graphs for m in modes if m != "plain"]
            for mode, graph in runs:
                row = one_step(strategy, plan, updates, mode, gone, pki, memory, graph, sizing)
                yield {"step": name, "mode": mode, "clients": clients, "dropped": len(gone), "sums_mb": sums_mb} | row


HEAD = (
    "| step | graph | k | t | mode | K | dropped | client s | median client s | coordinator s | sum s | advertise B "
    "| share kB | masked MB | confirm B | unmask kB | sent/client MB | received/client kB | coordinator peak MB "
    "| disk MB |"
)


def table_row(r: dict) -> str:
    rounds, secure = r["per_round"], r["mode"] != "plain"
    cell = lambda key, scale, fmt: format(rounds.get(key, 0) / scale, fmt) if secure else "—"  # noqa: E731
    client, median = (f"{r['client_s']:.2f}", f"{r['client_median_s']:.2f}") if secure else ("—", "—")
    k, t = (str(r["k"]), str(r["t"])) if secure else ("—", "—")
    received, disk = (f"{r['received'] / 1e3:.1f}", f"{r['disk'] / 1e6:.1f}") if secure else ("—", "—")
    return (
        f"| {r['step']} | {r['graph']} | {k} | {t} | {r['mode']} | {r['clients']} | {r['dropped']} | {client} | "
        f"{median} | "
        f"{r['coordinator_s']:.2f} | {r['client_s'] + r['coordinator_s']:.2f} | {cell('advertise', 1, '.0f')} | "
        f"{cell('share', 1e3, '.1f')} | {rounds['masked'] / 1e6:.3f} | {cell('confirm', 1, '.0f')} | "
        f"{cell('unmask', 1e3, '.2f')} | {r['sent'] / 1e6:.3f} | {received} | {r['peak'] / 1e6:.1f} | {disk} |"
    )


# ------------------------------------------------------------------------- the cost model

TERMS: dict[str, Callable[[float, float, float], float]] = {  # of (K, m, d): clients, neighbours each, dropped
    "1": lambda n, m, d: 1.0,
    "m": lambda n, m, d: m,
    "K": lambda n, m, d: n,
    "K m": lambda n, m, d: n * m,
    "d m": lambda n, m, d: d * m,
}
Forms = tuple[tuple[str, ...], ...]  # a figure's model forms, richest first
PER_CLIENT: Forms = (("1", "m"), ("1",))
COORDINATOR: Forms = (("1", "K", "K m", "d m"), ("1", "K m", "d m"), ("1", "K", "K m"), ("1", "K m"), ("1",))
FIGURES: tuple[tuple[str, str, Forms], ...] = (
    ("client s", "client_s", PER_CLIENT),
    ("sent/client MB", "sent", PER_CLIENT),
    ("coordinator s", "coordinator_s", COORDINATOR),
)


@dataclass(frozen=True)
class Fit:
    """A least-squares model ``sum_i coefficient_i term_i`` of one figure (:data:`TERMS`)."""

    terms: tuple[str, ...]
    coefficients: tuple[float, ...]

    def __call__(self, n: float, m: float, d: float) -> float:
        return sum(c * TERMS[t](n, m, d) for t, c in zip(self.terms, self.coefficients))

    @property
    def form(self) -> str:
        """The model written out: ``c0 + c1 K + ...``, coefficient ``ci`` of term ``i``."""
        return " + ".join(f"c{i}" if t == "1" else f"c{i} {t}" for i, t in enumerate(self.terms))


def fit(rows: list[dict], key: str, forms: Forms) -> Fit | None:
    """The richest of ``forms`` (richest first) that ``rows`` determine with a row to spare (else exactly), or None."""
    xs = [(float(r["clients"]), float(r["k"]), float(r["dropped"])) for r in rows]
    y = np.array([float(r[key]) for r in rows])
    for spare in (1, 0):
        for terms in forms:
            a = np.array([[TERMS[t](*x) for t in terms] for x in xs])
            if len(rows) >= len(terms) + spare and np.linalg.matrix_rank(a) == len(terms):
                coefficients = np.linalg.lstsq(a, y, rcond=None)[0]
                return Fit(terms, tuple(float(c) for c in coefficients))
    return None


def cost_model(rows: list[dict], dropped_shares: list[float], sizing: Sizing, at: int = MODEL_AT) -> list[str]:
    """The cost model's lines (module docstring): per graph and secure mode, each figure's fit and its prediction
    at ``at`` clients (sent in MB; the coordinator at each of ``dropped_shares``)."""
    lines = [
        f"cost model (least squares over the rows; m = neighbours per client, d = dropped; at {at:,} clients: "
        f"complete m = {at - 1}, sparse m = derive({at}, {sizing.dropout}, {sizing.corrupt}).k)",
        "",
        "| graph | mode | figure | rows | model | coefficients | m | predicted |",
        "|---|---|---|---|---|---|---|---|",
    ]
    groups = sorted({(r["graph"], r["mode"]) for r in rows if r["mode"] != "plain"})
    for graph, mode in groups:
        group = [r | {"sent": r["sent"] / 1e6} for r in rows if (r["graph"], r["mode"]) == (graph, mode)]
        m = at - 1 if graph == "complete" else derive(at, sizing.dropout, sizing.corrupt).k
        for figure, key, forms in FIGURES:
            model = fit(group, key, forms)
            if model is None:
                lines.append(f"| {graph} | {mode} | {figure} | {len(group)} | — | too few rows | {m} | — |")
                continue
            coefficients = ", ".join(f"c{i} = {c:.4g}" for i, c in enumerate(model.coefficients))
            if key == "coordinator_s":
                predicted = "; ".join(f"d = {round(s * at)}: {model(at, m, round(s * at)):.4g}" for s in dropped_shares)
            else:
                predicted = f"{model(at, m, 0):.4g}"
            lines.append(
                f"| {graph} | {mode} | {figure} | {len(group)} | {model.form} | {coefficients} | {m} | {predicted} |"
            )
    return lines


def steady_allocator() -> bool:
    """Keep glibc's ``malloc`` from mapping each block of a few MB afresh and handing freed memory back to the OS,
    as a process that has run a step before does: without it the first secure row of a process page-faults on
    every mask and key stream it allocates (millions of faults, its times about doubled), the later ones not.
    Whether it could (glibc only)."""
    try:
        mallopt = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").mallopt
    except (OSError, AttributeError):
        return False
    trim_threshold, mmap_threshold = -1, -3  # M_TRIM_THRESHOLD, M_MMAP_THRESHOLD (malloc.h)
    return bool(mallopt(trim_threshold, 1 << 30)) and bool(mallopt(mmap_threshold, 32 << 20))


def print_model(rows: list[dict], dropped_shares: list[float], sizing: Sizing) -> None:
    """The running sums' sizes and the cost model of each step of ``rows``."""
    sums = {r["step"]: r["sums_mb"] for r in rows}
    print("running sums per step (torch, not traced):", ", ".join(f"{s} {mb:.2f} MB" for s, mb in sums.items()))
    timed = [r for r in rows if r.get("coordinator_parts")]
    if timed:
        print("\nthe coordinator's seconds by part (its calls; of the secrets' rebuild, the masks' removal, the load):")
    for r in timed:
        parts = sorted(r["coordinator_parts"].items(), key=lambda p: -p[1])
        print(
            f"- {r['step']}, {r['graph']} {r['mode']}, K {r['clients']}, dropped {r['dropped']}: "
            + ", ".join(f"{name} {seconds:.2f}" for name, seconds in parts[:6])
        )
    for step in sums:
        print()
        if len(sums) > 1:
            print(f"step {step}:")
        print("\n".join(cost_model([r for r in rows if r["step"] == step], dropped_shares, sizing)))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-clinc150-quick")
    parser.add_argument("--method", default="lorm")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument(
        "--dropped", type=float, nargs="+", default=[0.0, 0.1], help="shares of clients that drop after sharing"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--graph", nargs="+", choices=GRAPHS, default=list(GRAPHS), help="the secure modes' graphs")
    parser.add_argument(
        "--dropout-target",
        type=float,
        default=0.1,
        help="secagg.dropout: the share of dropouts the sparse graph is for",
    )
    parser.add_argument(
        "--corrupt-target", type=float, default=0.05, help="secagg.corrupt: the share of colluders it is sized for"
    )
    parser.add_argument("--steps", nargs="+", help="steps to measure, e.g. 'train B' (default: every step of task 0)")
    parser.add_argument("--no-memory", action="store_true", help="skip the traced pass (no coordinator memory)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as one client core would)")
    parser.add_argument("--save", metavar="FILE", help="append each row to FILE, one JSON line (for --fit)")
    parser.add_argument(
        "--fit", metavar="FILE", nargs="+", help="measure nothing: the table and cost model of rows saved by --save"
    )
    args = parser.parse_args(argv)
    sizing = Sizing(args.dropout_target, args.corrupt_target)
    if args.fit:  # rows of several runs (each under the time a command may take), fitted together
        rows = [json.loads(line) for path in args.fit for line in Path(path).read_text().splitlines() if line]
        print(HEAD)
        print("|" + "---|" * (HEAD.count("|") - 1))
        print("\n".join(map(table_row, rows)))
        print_model(rows, args.dropped, sizing)
        return 0
    torch.set_num_threads(args.threads)
    steady = steady_allocator()
    config = validate(RunConfig(**(preset(args.preset) | {"method": args.method})))
    spec = build_runtime(config).spec
    print(
        f"{args.method} on {args.preset}: {len(spec.layers)} LoRA layers, head {spec.num_classes} x "
        f"{spec.feature_dim}; torch threads {torch.get_num_threads()}; sparse graph for dropout "
        f"{sizing.dropout}, corrupt {sizing.corrupt}; steady allocator {'yes' if steady else 'no'}"
    )
    rows = []
    with tempfile.TemporaryDirectory(prefix="secagg-pki-") as root:
        pki = dev_pki(max(args.clients), root) if "signed" in args.modes else None
        print(HEAD)
        print("|" + "---|" * (HEAD.count("|") - 1))
        for k in args.clients:
            for r in measure(
                config, spec, k, args.dropped, args.modes, pki, args.steps, not args.no_memory, args.graph, sizing
            ):
                print(table_row(r), flush=True)
                rows.append(r)
                if args.save:
                    with open(args.save, "a") as out:
                        out.write(json.dumps(r) + "\n")
    print_model(rows, args.dropped, sizing)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
