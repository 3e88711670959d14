"""What secure aggregation costs per step, in each mode: wall time, bytes per client, the coordinator's memory.

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
  signature; every client verifies the whole roster against the CA before sharing. A consistency round
  sits before the unmask: every survivor signs the request, and verifies the signatures it is shown before
  revealing anything.

``--dropped`` clients (a share of ``K``: the last ones) vanish after sharing their keys; in ``plain`` they
send nothing.

Figures per (step, mode, K, dropped):

- client s: the slowest client's compute over the whole step (its terms, keys, shares, mask, signatures and
  answers; no local training, which every mode shares). Coordinator s: all its calls, each taking its own
  copy of the message, as decoding it off the wire would. Their sum is the step's wall time without the
  network, clients running in parallel.
- bytes a surviving client sends, per round (payloads, no framing): advertise (index, two X25519 keys, the
  seed commitment; signed: certificate and signature), share (one 160-byte sealed box per other client;
  signed: then the recipient's x-coordinate and the dealer's signature over the box's header),
  masked (16 bytes per entry), confirm (a signature) and unmask (an index and 16 bytes per survivor's seed
  share, an index and 32 per dropped client's key share; signed: each with the box's header, x-coordinate and
  dealer's signature); and what it receives (roster, inbox, request, confirmations).
- the coordinator's peak memory over the step, above what it held before (``tracemalloc``): its side of
  the step run again alone from a transcript of the messages it received, so that the times above are not
  slowed by tracing. Traced: Python objects and numpy arrays (keys, certificates, sealed shares, the masked
  ring sum, answers, the masks it rebuilds). Not traced: torch tensors, i.e. the step's running sums
  (printed per step; the same in every mode) and, ``plain``, the update being folded.

Usage (the model's shapes from a preset; CLINC150 needs LORM_DATA_DIR)::

    OMP_NUM_THREADS=1 python bench/secagg_cost.py --preset cpu-clinc150-quick --clients 10 50 100 --dropped 0 0.1

Prints one table row per (step, mode, K, dropped); the figures in docs/BENCHMARKS.md come from it.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
import tracemalloc
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
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
from common.secagg.client_session import ClientSession
from common.secagg.primitives import FixedPoint, decode, encode
from common.secagg.rounds import Keys
from common.secagg.server_session import ServerSession
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import Layout, client_terms, context, fixed_point, pack, threshold, unpack
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
ROUNDS = ("advertise", "share", "masked", "confirm", "unmask")
INDEX = 4  # a client index on the wire


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


@dataclass
class Step:
    """One secure step as it ran: per-client seconds and bytes (sent per round, received by a survivor), the
    coordinator's seconds (``clock.server``), and what it takes to run the coordinator's side again alone:
    its session's parameters, the fixed point, the layout and the transcript of its calls in order, each with
    the client's message it received."""

    session: dict[str, Any]
    fp: FixedPoint
    layout: Layout
    clock: Timings = field(default_factory=Timings)
    sent: dict[int, Counter] = field(default_factory=dict)
    received: Counter = field(default_factory=Counter)
    transcript: list[tuple[str, tuple]] = field(default_factory=list)


def finish(server: ServerSession, aggregator: Aggregator, step: Step) -> None:
    """The coordinator's last turn: rebuild and check the secrets, remove the masks, load the survivors' sum."""
    survivors, _ = server.close_inputs()
    total = decode(server.result(), step.fp, len(survivors))
    load_sums(aggregator, unpack(step.layout.unflatten(total)), len(survivors), 16 * step.layout.size * len(survivors))


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

    The rounds are driven here rather than through ``lab.secure_rounds.secure_step``: the bench copies each
    message into the coordinator's memory, counts every field a client sends and records the coordinator's
    calls to replay them under ``tracemalloc`` (:func:`replay`), instrumentation that the engine's
    in-process step should not carry; that step stays exactly the honest protocol the engine runs."""
    clients, plan = len(updates), aggregator.plan
    t, ctx = threshold(settings, clients), context(plan)
    sessions, terms = {}, {}
    clock = Timings()
    for i, u in sorted(updates.items()):
        with clock.of(i):
            terms[i] = pack(client_terms(as_client.aggregator(plan), u))
            sessions[i] = ClientSession(i, t, ctx, (signers or {}).get(i), verifier)
    layout = Layout.of(terms[0])
    opened: dict[str, Any] = {"expected": list(range(clients)), "threshold": t, "context": ctx, "size": layout.size}
    if verifier is not None:  # boxes and answers carry their dealers' signatures, checked on arrival
        opened |= {"signed": True, "check": verifier.verify}
    run = Step(opened, fixed_point(settings, clients), layout, clock, {i: Counter() for i in updates})
    with clock.of(None):
        server = ServerSession(**opened)

    def deliver(call: str, *message: Any) -> Any:
        """The coordinator's call ``call`` on (its own copy of) a client's ``message``, timed and recorded."""
        run.transcript.append((call, message))
        with clock.of(None):
            return getattr(server, call)(*own(message))

    for i, s in sessions.items():
        keys = s.advertise()
        run.sent[i]["advertise"] += keys_bytes(keys)
        deliver("advertise", keys)
    roster = deliver("close_keys")
    run.received["roster"] = sum(keys_bytes(k) for k in roster.values())
    for i, s in sessions.items():
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
    run.received["request"] = INDEX * (len(survivors) + len(dropped))
    confirmations = None
    if verifier is not None:  # the consistency round
        for i in survivors:
            with clock.of(i):
                signature = sessions[i].confirm(survivors, dropped)
            run.sent[i]["confirm"] += len(signature)
            deliver("confirm", i, signature)
        confirmations = dict(server.confirmations)  # relayed as received
        run.received["confirmations"] = sum(INDEX + len(s) for s in confirmations.values())
    for i in survivors:
        inbox = deliver("inbox", i)
        with clock.of(i):
            answer = sessions[i].reveal(inbox, survivors, dropped, confirmations)
        run.sent[i]["unmask"] += sum(INDEX + len(s) for s in answer.values())
        deliver("reveal", i, answer)
    run.received["inbox"] = sum(len(b) for b in inbox.values())
    with clock.of(None):
        finish(server, aggregator, run)
    return run


def replay(strategy: Strategy, plan: RoundPlan, step: Step) -> None:
    """The coordinator's side of ``step`` run again alone, from its transcript, then the merge."""
    fold = strategy.fold(plan)
    server = ServerSession(**step.session)
    for call, message in step.transcript:
        getattr(server, call)(*own(message))
    finish(server, fold.aggregator, step)
    fold.finish()


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


def one_step(
    strategy: Strategy,
    plan: RoundPlan,
    updates: list[ClientUpdate],
    mode: str,
    gone: tuple[int, ...],
    pki: Pki | None,
    memory: bool = True,
) -> dict:
    """One (mode, dropped) run of the step: its row's figures (``memory``: the coordinator's, measured again
    under ``tracemalloc`` after the timed run; else 0)."""
    survivors = [i for i in range(len(updates)) if i not in gone]
    if mode == "plain":
        uploads = [updates[i] for i in survivors]
        start = time.perf_counter()
        plain(strategy, plan, uploads)
        seconds = time.perf_counter() - start
        peak = traced_peak(lambda: plain(strategy, plan, uploads)) if memory else 0
        sent = statistics.mean(u.nbytes for u in uploads)
        return {"client_s": 0.0, "coordinator_s": seconds, "per_round": {"masked": sent}, "sent": sent} | {
            "received": 0.0,
            "peak": peak,
        }
    fold = strategy.fold(plan)
    settings = SecAggSettings(enabled=True, mode=mode)
    signers, verifier = (pki.signers, pki.verifier) if mode == "signed" and pki else (None, None)
    run = secure_run(fold.aggregator, strategy, dict(enumerate(updates)), settings, gone, signers, verifier)
    start = time.perf_counter()
    fold.finish()
    coordinator_s = run.clock.server + time.perf_counter() - start
    per_round = {r: statistics.mean(run.sent[i][r] for i in survivors) for r in ROUNDS}
    return {
        "client_s": max(run.clock.client.values()),
        "coordinator_s": coordinator_s,
        "per_round": per_round,
        "sent": sum(per_round.values()),
        "received": float(sum(run.received.values())),
        "peak": traced_peak(lambda: replay(strategy, plan, run)) if memory else 0,
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
) -> Iterator[dict]:
    """Rows of figures for each step of the first task (``steps``: those named, e.g. ``train B``)."""
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
            for mode in modes:
                row = one_step(strategy, plan, updates, mode, gone, pki, memory)
                yield {"step": name, "mode": mode, "clients": clients, "dropped": len(gone), "sums_mb": sums_mb} | row


HEAD = (
    "| step | mode | K | dropped | client s | coordinator s | sum s | advertise B | share kB | masked MB "
    "| confirm B | unmask kB | sent/client MB | received/client kB | coordinator peak MB |"
)


def table_row(r: dict) -> str:
    rounds, secure = r["per_round"], r["mode"] != "plain"
    cell = lambda key, scale, fmt: format(rounds.get(key, 0) / scale, fmt) if secure else "—"  # noqa: E731
    client = f"{r['client_s']:.2f}" if secure else "—"
    return (
        f"| {r['step']} | {r['mode']} | {r['clients']} | {r['dropped']} | {client} | {r['coordinator_s']:.2f} | "
        f"{r['client_s'] + r['coordinator_s']:.2f} | {cell('advertise', 1, '.0f')} | {cell('share', 1e3, '.1f')} | "
        f"{rounds['masked'] / 1e6:.3f} | {cell('confirm', 1, '.0f')} | {cell('unmask', 1e3, '.2f')} | "
        f"{r['sent'] / 1e6:.3f} | {format(r['received'] / 1e3, '.1f') if secure else '—'} | {r['peak'] / 1e6:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="cpu-clinc150-quick")
    parser.add_argument("--method", default="lorm")
    parser.add_argument("--clients", type=int, nargs="+", default=[10, 50, 100])
    parser.add_argument(
        "--dropped", type=float, nargs="+", default=[0.0, 0.1], help="shares of clients that drop after sharing"
    )
    parser.add_argument("--modes", nargs="+", choices=MODES, default=list(MODES))
    parser.add_argument("--steps", nargs="+", help="steps to measure, e.g. 'train B' (default: every step of task 0)")
    parser.add_argument("--no-memory", action="store_true", help="skip the traced pass (no coordinator memory)")
    parser.add_argument("--threads", type=int, default=1, help="torch threads (1: as one client core would)")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    config = validate(RunConfig(**(preset(args.preset) | {"method": args.method})))
    spec = build_runtime(config).spec
    print(
        f"{args.method} on {args.preset}: {len(spec.layers)} LoRA layers, head {spec.num_classes} x "
        f"{spec.feature_dim}; torch threads {torch.get_num_threads()}"
    )
    with tempfile.TemporaryDirectory(prefix="secagg-pki-") as root:
        pki = dev_pki(max(args.clients), root) if "signed" in args.modes else None
        print(HEAD)
        print("|" + "---|" * (HEAD.count("|") - 1))
        sums = {}
        for k in args.clients:
            for r in measure(config, spec, k, args.dropped, args.modes, pki, args.steps, not args.no_memory):
                print(table_row(r), flush=True)
                sums[r["step"]] = r["sums_mb"]
    print("running sums per step (torch, not traced):", ", ".join(f"{s} {mb:.2f} MB" for s, mb in sums.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
