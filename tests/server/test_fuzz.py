"""Fuzzing every RPC and the chunk stream of a real gRPC server on loopback; SecAgg at two rounds.

Mutated valid messages (field values, field swaps, bit flips, truncations, random bytes;
for Push also chunks reordered, duplicated, dropped, retargeted and corrupted) and random
messages, from a seeded RNG, bounded in count and in time. After every case: the server
still answers, the call ended OK or with one of the codes a refusal uses (never UNKNOWN
nor INTERNAL from an unhandled exception), and the coordinator's state — status, history,
clients, files on disk, the open step's running sums — is exactly as before, unless the
call was an accepted new submission (a mutation can leave an update valid), after which
the harness starts over from a fresh coordinator.

A failing case prints its RPC, seed and case number; run with ``-s`` for the counts.
"""

from __future__ import annotations

import collections
import hashlib
import json
import math
import random
import time
from dataclasses import fields, is_dataclass, replace

import grpc
import pytest
import torch
from google.protobuf.descriptor import FieldDescriptor
from google.protobuf.message import Message
from grpc_health.v1 import health_pb2, health_pb2_grpc

from common.infra.tls import Security, token_digest
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.terms import context, threshold
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import HEAD_GRAM
from proto import codec, secagg_codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.coordinator import Coordinator
from server.secure.intake import SecureIntake
from server.service import create_server

from unit_helpers import LORA_SPEC, valid_update

SPEC = LORA_SPEC
CASES = 300  # per RPC, at most
TIME_CAP_S = 20.0  # per RPC, at most
MIN_CASES = 40  # fewer than this in the time cap means the machine is too loaded for the test to mean much
SEED = 20261122
REFUSALS = {
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.PERMISSION_DENIED,
    grpc.StatusCode.ALREADY_EXISTS,
    grpc.StatusCode.RESOURCE_EXHAUSTED,
}
SERVICE = "/lorm.v1.Coordinator/"


def good_update(coord: Coordinator, index: int) -> ClientUpdate:
    """A valid update of the open step for client ``index``."""
    assert coord.step is not None and coord.step.aggregator is not None
    return valid_update(coord.step.plan, coord.step.aggregator.expected(), index, seed=index)


# ------------------------------------------------------------------ the server and its state


def _tensors_of(obj, seen: set[int], depth: int = 0):
    """Every tensor reachable from an aggregator (its running sums), in a fixed order."""
    if depth > 6 or id(obj) in seen:
        return
    seen.add(id(obj))
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for k in sorted(obj, key=str):
            yield from _tensors_of(obj[k], seen, depth + 1)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from _tensors_of(v, seen, depth + 1)
    elif is_dataclass(obj) or hasattr(obj, "__dict__"):
        names = [f.name for f in fields(obj)] if is_dataclass(obj) else sorted(vars(obj))
        for name in names:
            yield from _tensors_of(getattr(obj, name), seen, depth + 1)


class Harness:
    """A coordinator at task 0 round 0 (client 0 already submitted, so its sums are non-zero), served on loopback."""

    def __init__(self, tmp_path) -> None:
        self.tmp_path, self.generation = tmp_path, 0
        self.server = None
        self.start()

    def start(self) -> None:
        if self.server is not None:
            self.close()
        self.generation += 1
        config = RunConfig(run_id="fuzz", num_clients=3, num_tasks=2, rounds_per_task=1, rank=2, seed=1)
        coord = Coordinator(config, self.tmp_path / f"state{self.generation}")
        for i in range(3):
            coord.join(f"c{i}", i)
            coord.describe(f"c{i}", SPEC)
        coord.submit(good_update(coord, 0), "k0")
        self.coord = coord
        self.server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")  # no client-side size limits
        self.stub = pb_grpc.CoordinatorStub(self.channel)
        self.raw_unary = {
            name: self.channel.unary_unary(SERVICE + name, request_serializer=None, response_deserializer=None)
            for name in ("Join", "Describe", "ReportEval", "Status")
        }
        self.raw_pull = self.channel.unary_stream(SERVICE + "Pull", request_serializer=None, response_deserializer=None)
        self.raw_push = self.channel.stream_unary(SERVICE + "Push", request_serializer=None, response_deserializer=None)
        self.before = self.state()

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)

    def state(self) -> tuple:
        coord = self.coord
        with coord.lock:
            step = coord.step
            files = []
            for p in sorted(coord.store.root.rglob("*")):
                if p.is_file():
                    files.append((str(p.relative_to(coord.store.root)), hashlib.sha256(p.read_bytes()).hexdigest()))
            sums = hashlib.sha256()
            for t in _tensors_of(step.aggregator, set()):
                sums.update(t.detach().contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
            return (
                coord.status(),
                list(coord.run.history),
                dict(coord.run.roster.clients),
                coord.run.spec,
                coord.run.state,
                step.next_fold,
                sorted(step.submitted),
                step.aggregator.count,
                step.aggregator.num_samples,
                sums.hexdigest(),
                files,
            )

    def alive(self) -> bool:
        status = self.stub.Status(pb.StatusRequest(), timeout=10)
        health = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service="lorm.v1.Coordinator"), timeout=10
        )
        return status.run_id == "fuzz" and health.status == health_pb2.HealthCheckResponse.SERVING


@pytest.fixture
def harness(tmp_path):
    h = Harness(tmp_path)
    yield h
    h.close()


# ------------------------------------------------------------------ mutations

STRINGS = [
    "",
    "fuzz",
    "c0",
    "c1",
    "c2",
    "c9",
    "other",
    "k0",
    "x" * 10_000,
    "\u00e9\u4e2d\U0001f600",
    "../../etc",
    "factor/l1/B",
    "gram/l1",
    "head/gram",
    "head/weight",
    "lora/l1/A",
    "float32",
    "float64",
    "int64",
    "bool",
]
INTS = [0, 1, 2, -1, 3, 5, 6, 12, 2**31 - 1, -(2**31), 2**62, -(2**63), 2**63 - 1]
FLOATS = [0.0, -0.0, 0.5, 1.0, -1.0, float("nan"), float("inf"), float("-inf"), 1e308, 5e-324]
INT_TYPES = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_FIXED32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_ENUM: (-(2**31), 2**31 - 1),
}


def random_scalar(rng: random.Random, field: FieldDescriptor):
    t = field.type
    if t == FieldDescriptor.TYPE_STRING:
        return (
            rng.choice(STRINGS)
            if rng.random() < 0.7
            else "".join(chr(rng.randrange(1, 0x3000)) for _ in range(rng.randrange(40)))
        )
    if t == FieldDescriptor.TYPE_BYTES:
        return rng.randbytes(rng.choice([0, 1, 3, 64, 1000]))
    if t == FieldDescriptor.TYPE_BOOL:
        return rng.random() < 0.5
    if t == FieldDescriptor.TYPE_DOUBLE:
        return rng.choice(FLOATS) if rng.random() < 0.7 else rng.uniform(-1e6, 1e6)
    lo, hi = INT_TYPES[t]
    value = rng.choice(INTS) if rng.random() < 0.7 else rng.randrange(-10, 10)
    return min(max(value, lo), hi)


def mutate_field(rng: random.Random, msg: Message) -> None:
    """Set one (possibly nested or repeated) field of ``msg`` to a random value, or clear it."""
    field = rng.choice(msg.DESCRIPTOR.fields)
    if field.type == FieldDescriptor.TYPE_MESSAGE:
        if field.is_repeated:
            items = getattr(msg, field.name)
            if items and rng.random() < 0.7:
                mutate_field(rng, rng.choice(items))
            elif items and rng.random() < 0.5:
                del items[rng.randrange(len(items))]
            else:
                items.add()
        elif rng.random() < 0.2:
            msg.ClearField(field.name)
        else:
            mutate_field(rng, getattr(msg, field.name))
        return
    if field.is_repeated:
        values = getattr(msg, field.name)
        del values[:]
        values.extend(random_scalar(rng, field) for _ in range(rng.choice([0, 1, 2, 3, 7])))
    elif rng.random() < 0.15 and field.containing_oneof is None:
        msg.ClearField(field.name)
    else:
        setattr(msg, field.name, random_scalar(rng, field))


def swap_fields(rng: random.Random, msg: Message) -> None:
    """Exchange the values of two scalar fields of one type (e.g. ``run_id`` and ``client_id``)."""
    by_type = collections.defaultdict(list)
    for f in msg.DESCRIPTOR.fields:
        if not f.is_repeated and f.type != FieldDescriptor.TYPE_MESSAGE:
            by_type[f.type].append(f.name)
    groups = [names for names in by_type.values() if len(names) > 1]
    if groups:
        a, b = rng.sample(rng.choice(groups), 2)
        va, vb = getattr(msg, a), getattr(msg, b)
        setattr(msg, a, vb)
        setattr(msg, b, va)


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """Bit flips, a truncation, inserted or replaced random bytes, or random bytes altogether."""
    kind = rng.randrange(5)
    b = bytearray(data)
    if kind == 0 and b:
        for _ in range(rng.randint(1, 8)):
            b[rng.randrange(len(b))] ^= 1 << rng.randrange(8)
    elif kind == 1:
        b = b[: rng.randrange(len(b) + 1)]
    elif kind == 2:
        at = rng.randrange(len(b) + 1)
        b[at:at] = rng.randbytes(rng.randint(1, 16))
    elif kind == 3 and b:
        at = rng.randrange(len(b))
        b[at : at + 4] = rng.randbytes(4)
    else:
        b = bytearray(rng.randbytes(rng.randrange(200)))
    return bytes(b)


def mutate_message(rng: random.Random, base: Message) -> Message | bytes:
    """A mutated copy of ``base``: a message, or raw bytes that may not even parse."""
    msg = type(base)()
    msg.CopyFrom(base)
    kind = rng.randrange(4)
    if kind == 0:
        for _ in range(rng.randint(1, 3)):
            mutate_field(rng, msg)
    elif kind == 1:
        swap_fields(rng, msg)
        mutate_field(rng, msg)
    elif kind == 2:
        return mutate_bytes(rng, msg.SerializeToString())
    else:
        msg = type(base)()  # a random message of this type
        for _ in range(rng.randint(0, 6)):
            mutate_field(rng, msg)
    return msg


JSON_VALUES = [
    None,
    -1,
    0,
    1,
    3,
    2**70,
    float("inf"),
    float("nan"),
    -0.5,
    "4",
    "",
    [],
    {},
    [[5, 4]],
    [5],
    {"l1": [5, 4]},
    {"l1": [-5, 4]},
    {"l1": [0, 4]},
    {"": [1, 1]},
    True,
]


def mutate_json(rng: random.Random, text: str) -> str:
    """The model description with one value (top-level, or a layer's) replaced, or a key dropped."""
    value = json.loads(text)
    target = value["layers"] if rng.random() < 0.4 and value["layers"] else value
    key = rng.choice(sorted(target))
    if rng.random() < 0.2:
        del target[key]
    else:
        target[key] = rng.choice(JSON_VALUES)
    return json.dumps(value)  # NaN and Infinity included, as a careless client might send them


def corrupt_update(rng: random.Random, update: ClientUpdate) -> ClientUpdate:
    """A value-level corruption behind valid framing and checksums: reaches the update's validation."""
    tensors = dict(update.tensors)
    name = rng.choice(sorted(tensors))
    t = tensors[name].clone()
    kind = rng.randrange(6)
    if kind == 0:
        t.view(-1)[rng.randrange(t.numel())] = rng.choice([float("nan"), float("inf"), float("-inf")])
    elif kind == 1:
        t = -t - 1.0  # negative Gram diagonals, indefinite Grams; any sign for factors
    elif kind == 2:
        t = t.to(rng.choice([torch.float16, torch.bfloat16, torch.float64, torch.int32, torch.uint8, torch.bool]))
    elif kind == 3:
        t = torch.cat([t, t[:1]]) if rng.random() < 0.5 else t[1:]
    elif kind == 4:
        if t.dim() == 2 and t.shape[0] == t.shape[1]:
            t[0, -1] += 1.0 + float(t.abs().max())  # asymmetric
        else:
            t = t * 1e30
    else:
        update.num_samples = rng.choice(INTS)
        update.train_loss = rng.choice(FLOATS)
    tensors[name] = t
    return replace(update, tensors=tensors)


def assert_plausible(update: ClientUpdate, reference: ClientUpdate, where: str) -> None:
    """An accepted update, judged without common.aggregation.validate: the reference's tensors, floating,
    finite, Gram diagonals non-negative; a sample count in the run's bounds; a loss NaN or finite >= 0."""
    got, want = update.tensors, reference.tensors
    assert got.keys() == want.keys(), where
    for name, t in got.items():
        assert t.shape == want[name].shape and t.dtype in (torch.float32, torch.float64), (where, name)
        assert bool(torch.isfinite(t).all()), (where, name)
        if name.startswith("gram/") or name == HEAD_GRAM:
            assert bool(((torch.diagonal(t) if t.dim() == 2 else t) >= 0).all()), (where, name)
    assert 6 <= update.num_samples <= 100_000_000, where
    assert math.isnan(update.train_loss) or 0 <= update.train_loss < math.inf, where


def mutate_stream(rng: random.Random, stream: list[pb.UpdateChunk]) -> list[pb.UpdateChunk | bytes]:
    """A mutated Push stream: its envelope, its chunks, their order, or raw bytes of one message."""
    msgs = [pb.UpdateChunk.FromString(m.SerializeToString()) for m in stream]
    kind = rng.randrange(10)
    chunks = range(1, len(msgs))
    if kind == 0:  # the envelope's fields, headers included
        for _ in range(rng.randint(1, 3)):
            mutate_field(rng, msgs[0].envelope)
    elif kind == 1:
        swap_fields(rng, msgs[0].envelope)
    elif kind == 2:  # chunks reordered
        i, j = rng.sample(chunks, 2)
        msgs[i], msgs[j] = msgs[j], msgs[i]
    elif kind == 3:  # a chunk duplicated
        i = rng.choice(chunks)
        msgs.insert(rng.randint(1, len(msgs)), msgs[i])
    elif kind == 4:  # a chunk (or the envelope) omitted
        del msgs[rng.randrange(len(msgs))]
    elif kind == 5:  # one chunk's fields
        mutate_field(rng, msgs[rng.choice(chunks)].chunk)
    elif kind == 6:  # a second envelope, or a chunk first
        if rng.random() < 0.5:
            msgs.insert(rng.randint(1, len(msgs)), msgs[0])
        else:
            msgs.insert(0, msgs[rng.choice(chunks)])
    elif kind == 7:  # raw bytes of one message
        i = rng.randrange(len(msgs))
        out: list = list(msgs)
        out[i] = mutate_bytes(rng, msgs[i].SerializeToString())
        return out
    elif kind == 8:  # truncated stream
        msgs = msgs[: rng.randrange(len(msgs))]
    else:  # random messages
        msgs = []
        for _ in range(rng.randint(0, 5)):
            m = pb.UpdateChunk()
            mutate_field(rng, m.envelope if rng.random() < 0.4 else m.chunk)
            msgs.append(m)
    return msgs


# ------------------------------------------------------------------ the campaign


def _raw(m) -> bytes:
    return m if isinstance(m, bytes) else m.SerializeToString()


def _outcome(call) -> tuple[str, object]:
    try:
        return "OK", call()
    except grpc.RpcError as err:
        return err.code().name, err


def campaign(harness: Harness, rpc: str, make_case, run_case) -> collections.Counter:
    """Up to CASES cases (TIME_CAP_S seconds) of one RPC; returns outcome counts by status code."""
    rng = random.Random(f"{SEED}-{rpc}")
    counts: collections.Counter = collections.Counter()
    start, n = time.monotonic(), 0
    while n < CASES and time.monotonic() - start < TIME_CAP_S:
        case = make_case(rng, harness)
        code, result = _outcome(lambda case=case: run_case(harness, case))
        where = f"{rpc} case {n} (seed {SEED}-{rpc}): {code}"
        if code != "OK":
            details = result.details() or ""
            # INTERNAL only as gRPC's own answer to bytes that do not parse as the request message;
            # "Stream removed" is a client dropping a reply whose details are too long a header.
            assert grpc.StatusCode[code] in REFUSALS or (code == "INTERNAL" and "deserializ" in details.lower()), (
                f"{where} {details!r}"
            )
            assert "Stream removed" not in details, f"{where} {details!r}"
        new_submission = rpc == "Push" and code == "OK" and not result.duplicate
        if new_submission:
            counts["accepted (still valid after mutation)"] += 1
            coord = harness.coord
            assert sorted(coord.step.submitted) == [0, 1], where
            assert_plausible(coord.store.load_update(coord.step.key, 1), good_update(coord, 1), where)
            harness.start()
        else:
            assert harness.state() == harness.before, f"{where}: the coordinator's state changed"
        counts[code] += 1
        n += 1
    assert harness.alive()
    assert harness.state() == harness.before
    assert n >= MIN_CASES, f"only {n} {rpc} cases in {TIME_CAP_S} s"
    print(f"\n{rpc}: {n} cases in {time.monotonic() - start:.1f} s: {dict(sorted(counts.items()))}")
    return counts


def _unary(name: str):
    def run(h: Harness, case):
        reply = h.raw_unary[name](_raw(case), timeout=10)
        return reply

    return run


UNARY_BASES = {
    "Join": lambda h: [
        pb.JoinRequest(client_id="c1", wire_version=codec.WIRE_VERSION),
        pb.JoinRequest(client_id="c1", requested_index=1, wire_version=codec.WIRE_VERSION),
        pb.JoinRequest(client_id="c7", requested_index=2, wire_version=codec.WIRE_VERSION),
    ],
    "Describe": lambda h: [pb.ModelDescription(run_id="fuzz", client_id="c1", model_spec_json=SPEC.to_json())],
    "Describe (JSON)": lambda h: [pb.ModelDescription(run_id="fuzz", client_id="c1", model_spec_json=SPEC.to_json())],
    "ReportEval": lambda h: [
        pb.EvalReport(
            run_id="fuzz", client_id="c1", client_index=1, task=0, idempotency_key="e1", correct=[3], total=[4]
        )
    ],
    "Status": lambda h: [pb.StatusRequest(run_id="fuzz"), pb.StatusRequest()],
}


@pytest.mark.parametrize("rpc", sorted(UNARY_BASES))
def test_fuzz_unary_rpc(harness, rpc):
    bases = UNARY_BASES[rpc](harness)

    def make(rng: random.Random, h: Harness):
        if rpc.endswith("(JSON)"):  # structure-aware: a model description with odd values
            return pb.ModelDescription(
                run_id="fuzz", client_id=rng.choice(["c1", "c7"]), model_spec_json=mutate_json(rng, SPEC.to_json())
            )
        return mutate_message(rng, rng.choice(bases))

    counts = campaign(harness, rpc, make, _unary(rpc.split()[0]))
    assert sum(v for k, v in counts.items() if k != "OK") > 0  # the mutations do reach the refusals


def test_fuzz_pull(harness):
    bases = [
        pb.PullRequest(run_id="fuzz", client_id="c1"),
        pb.PullRequest(run_id="fuzz", client_id="c0", last_completed=pb.StepRef(task=0, round=0, phase=pb.PHASE_TRAIN)),
    ]

    def run(h: Harness, case):
        return list(h.raw_pull(_raw(case), timeout=10))

    counts = campaign(harness, "Pull", lambda rng, h: mutate_message(rng, rng.choice(bases)), run)
    assert counts["OK"] > 0 and sum(v for k, v in counts.items() if k != "OK") > 0


def test_fuzz_push_and_the_chunk_stream(harness):
    def make(rng: random.Random, h: Harness):
        index = 1 if rng.random() < 0.85 else 0  # client 0 has submitted: its pushes are duplicates
        update = good_update(h.coord, index)
        if rng.random() < 0.3:  # valid framing, bad values
            return list(codec.update_to_proto(corrupt_update(rng, update), f"p{index}", chunk_bytes=48))
        return mutate_stream(rng, list(codec.update_to_proto(update, f"p{index}", chunk_bytes=48)))

    def run(h: Harness, case):
        return pb.PushReply.FromString(h.raw_push(iter([_raw(m) for m in case]), timeout=10))

    counts = campaign(harness, "Push", make, run)
    assert counts["INVALID_ARGUMENT"] > 0 and counts["FAILED_PRECONDITION"] + counts["PERMISSION_DENIED"] > 0


# ------------------------------------------------------------------ SecAgg

SECAGG = SERVICE + "SecAgg"
SECAGG_REFUSALS = REFUSALS | {grpc.StatusCode.ABORTED}  # ABORTED: a call of another session (attempt)
STAGES = {name: i + 1 for i, name in enumerate(secagg_codec.SECAGG_STAGES)}
ODD_INDICES = [0, 2, 0, 2, -1, 3, 7, 2**31 - 1, -(2**31)]  # another client's index, most often
ODD_KEY_LENGTHS = [0, 1, 31, 33, 64, 4096]
FUZZER = 1  # the fuzzing client: authenticated as c1, index 1
SECAGG_CASES = 800  # per round fuzzed, at most (a case takes a few ms)


class SecAggHarness:
    """A secure step of 3 clients served on loopback with bearer tokens; the fuzzer holds c1's token.

    ``stage`` "keys": client 0 has advertised, the roster is open. "shares": all three advertised, the
    roster is fixed and clients 0 and 2 sent their sealed shares; client 1's are awaited."""

    def __init__(self, tmp_path, stage: str) -> None:
        self.tmp_path, self.stage, self.generation, self.server = tmp_path, stage, 0, None
        tokens = tmp_path / "tokens.json"
        tokens.write_text(json.dumps({f"c{i}": token_digest(f"token-c{i}") for i in range(3)}))
        self.security = Security(token_file=str(tokens), insecure=True)
        self.start()

    def start(self) -> None:
        if self.server is not None:
            self.close()
        self.generation += 1
        config = RunConfig(
            run_id="fuzz",
            num_clients=3,
            num_tasks=1,
            rounds_per_task=1,
            rank=2,
            seed=1,
            settings={"secagg": {"enabled": True}},
        )
        coord = Coordinator(config, self.tmp_path / f"secagg{self.generation}")
        for i in range(3):
            coord.join(f"c{i}", i)
            coord.describe(f"c{i}", SPEC)
        plan = coord.pull("c0")
        assert isinstance(plan, RoundPlan) and coord.step is not None and isinstance(coord.step.intake, SecureIntake)
        self.coord, self.plan, self.ref = coord, plan, (plan.task, plan.round, plan.phase)
        t = threshold(SecAggSettings(enabled=True), 3)
        self.sessions = [ClientSession(i, t, context(plan)) for i in range(3)]
        self.secagg(0, "advertise", keys=self.sessions[0].advertise())
        self.roster: dict = {}
        if self.stage == "shares":
            for i in (1, 2):
                self.secagg(i, "advertise", keys=self.sessions[i].advertise())
            self.roster = {k.index: k for k in self.secagg(0, "roster")["roster"]}
            for i in (0, 2):
                self.secagg(i, "share", shares=self.sessions[i].share(self.roster))
        self.server, port = create_server(coord, "127.0.0.1:0", security=self.security)
        self.server.start()
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.raw = self.channel.unary_unary(SECAGG, request_serializer=None, response_deserializer=None)
        self.before = self.state()

    def secagg(self, i: int, stage: str, **kw) -> dict:
        return self.coord.secagg(f"c{i}", i, "fuzz", self.ref, stage, **kw)

    def request(self, stage: str, **kw) -> pb.SecAggRequest:
        """The fuzzer's honest request of ``stage`` in the open session."""
        return secagg_codec.secagg_request_to_proto("fuzz", "c1", FUZZER, self.ref, stage, **kw)

    def bases(self) -> list[pb.SecAggRequest]:
        session = self.sessions[FUZZER]
        shares = session.share(self.roster) if self.roster else {0: bytes(80), 2: bytes(80)}
        return [
            self.request("advertise", keys=session.advertise()),
            self.request("roster"),
            self.request("share", shares=shares),
            self.request("inbox"),
            self.request("unmask"),
            self.request("reveal", shares={0: bytes(16), 1: bytes(16), 2: bytes(16)}),
        ]

    def call(self, case) -> pb.SecAggReply:
        return pb.SecAggReply.FromString(
            self.raw(_raw(case), timeout=20, metadata=(("authorization", "Bearer token-c1"),))
        )

    def close(self) -> None:
        self.channel.close()
        self.server.stop(0)

    def state(self) -> tuple:
        coord = self.coord
        with coord.lock:
            step = coord.step
            assert step is not None and isinstance(step.intake, SecureIntake)
            files = sorted(
                (str(p.relative_to(coord.store.root)), hashlib.sha256(p.read_bytes()).hexdigest())
                for p in coord.store.root.rglob("*")
                if p.is_file()
            )
            return (
                coord.status(operator=True),
                json.dumps(step.intake.secure.state(), sort_keys=True),
                dict(coord.run.roster.clients),
                coord.run.state,
                sorted(step.submitted),
                files,
            )

    def alive(self) -> bool:
        stub = pb_grpc.CoordinatorStub(self.channel)
        status = stub.Status(pb.StatusRequest(), timeout=10, metadata=(("authorization", "Bearer token-c0"),))
        health = health_pb2_grpc.HealthStub(self.channel).Check(
            health_pb2.HealthCheckRequest(service="lorm.v1.Coordinator"), timeout=10
        )
        return status.run_id == "fuzz" and health.status == health_pb2.HealthCheckResponse.SERVING


def mutate_secagg(rng: random.Random, base: pb.SecAggRequest) -> pb.SecAggRequest | bytes:
    """Generic mutations a third of the time; else one or two targeted ones: the stage, the indices, the
    keys' lengths, the share list (huge, odd peers, odd sizes), the attempt, the step."""
    if rng.random() < 0.3:
        return mutate_message(rng, base)
    msg = pb.SecAggRequest()
    msg.CopyFrom(base)
    for _ in range(rng.randint(1, 2)):
        kind = rng.randrange(8)
        if kind == 0:
            msg.stage = rng.choice([0, -1, 7, 8, 9, 99, 2**31 - 1, *STAGES.values()])  # type: ignore[assignment]
        elif kind == 1:
            msg.client_index = rng.choice(ODD_INDICES)
        elif kind == 2:
            msg.keys.index = rng.choice(ODD_INDICES)
        elif kind == 3:
            field = rng.choice(["cipher_public", "mask_public"])
            setattr(msg.keys, field, rng.randbytes(rng.choice(ODD_KEY_LENGTHS)))
        elif kind == 4:  # a huge share list: many peers, or one box of megabytes
            count, size = rng.choice([(5_000, 64), (60_000, 16), (1, 3 << 20)])
            del msg.shares[:]
            msg.shares.extend(pb.SecAggShare(peer=rng.choice(ODD_INDICES), data=bytes(size)) for _ in range(count))
        elif kind == 5:  # odd peers and sizes among the shares
            share = msg.shares.add()
            share.peer = rng.choice(ODD_INDICES)
            share.data = rng.randbytes(rng.choice([0, 1, 15, 16, 17, 32, 48, 80, 1000]))
        elif kind == 6:
            msg.attempt = rng.choice([-1, 1, 2, 2**31 - 1, -(2**31)])
        else:
            msg.step.task, msg.step.round = rng.choice([(0, 1), (1, 0), (-1, 0), (2**31 - 1, 0)])
    return msg


def own_change(before: tuple, after: tuple) -> str:
    """'' when the fuzzer's call changed only what the fuzzer may change (its own keys, boxes or answers in
    the open session; its own exclusion or a restart blaming it alone); else what else changed."""
    if before[2:5] != after[2:5] or before[0]["metrics"].get("history") != after[0]["metrics"].get("history"):
        return "the run's clients, state, submissions or history"
    was, now = json.loads(before[1]), json.loads(after[1])
    if now["attempt"] != was["attempt"] or now.get("excluded") != was.get("excluded"):
        blamed = set(now.get("excluded", {})) - set(was.get("excluded", {}))
        return "" if blamed <= {str(FUZZER)} else f"clients {sorted(blamed)} blamed for the fuzzer's call"
    s0, s1 = was["session"], now["session"]
    for part in ("keys", "boxes", "revealed"):
        others0 = {k: v for k, v in (s0.get(part) or {}).items() if k != str(FUZZER)}
        others1 = {k: v for k, v in (s1.get(part) or {}).items() if k != str(FUZZER)}
        if others0 != others1:
            return f"other clients' {part}: {sorted(others0)} -> {sorted(others1)}"
    return ""


def _client_id(case) -> str:
    try:
        return (pb.SecAggRequest.FromString(case) if isinstance(case, bytes) else case).client_id
    except Exception:  # bytes that do not parse: no client id
        return ""


def secagg_campaign(h: SecAggHarness) -> collections.Counter:
    rng = random.Random(f"{SEED}-SecAgg-{h.stage}")
    counts: collections.Counter = collections.Counter()
    start, n = time.monotonic(), 0
    while n < SECAGG_CASES and time.monotonic() - start < TIME_CAP_S:
        case = mutate_secagg(rng, rng.choice(h.bases()))
        code, result = _outcome(lambda case=case: h.call(case))
        where = f"SecAgg ({h.stage}) case {n} (seed {SEED}-SecAgg-{h.stage}): {code}"
        if code != "OK":
            details = result.details() or ""
            assert grpc.StatusCode[code] in SECAGG_REFUSALS or (
                code == "INTERNAL" and "deserializ" in details.lower()
            ), f"{where} {details!r}"
            assert "Stream removed" not in details, f"{where} {details!r}"
        after = h.state()
        if after != h.before:
            wrong = own_change(h.before, after)
            assert not wrong, f"{where}: the fuzzer's call changed {wrong}"
            counts["changed its own part"] += 1
            h.start()
        counts[code] += 1
        n += 1
    assert h.alive() and h.state() == h.before
    assert n >= MIN_CASES, f"only {n} SecAgg cases in {TIME_CAP_S} s"
    print(f"\nSecAgg ({h.stage}): {n} cases in {time.monotonic() - start:.1f} s: {dict(sorted(counts.items()))}")
    return counts


@pytest.mark.parametrize("stage", ["keys", "shares"])
def test_fuzz_secagg_then_the_honest_clients_go_on(tmp_path, stage):
    h = SecAggHarness(tmp_path, stage)
    try:
        counts = secagg_campaign(h)
        assert sum(v for k, v in counts.items() if k not in ("OK", "changed its own part")) > 0
        session = h.sessions[FUZZER]
        if stage == "keys":  # the run is not wedged: the honest clients' calls still work
            for i in (1, 2):
                assert h.secagg(i, "advertise", keys=h.sessions[i].advertise())["ready"]
            assert sorted(k.index for k in h.secagg(2, "roster")["roster"]) == [0, 1, 2]
        else:
            reply = h.call(h.request("share", shares=session.share(h.roster)))
            assert reply.ready
            inbox = h.secagg(0, "inbox")
            assert inbox["ready"] and inbox["sharers"] == [0, 1, 2] and sorted(inbox["shares"]) == [1, 2]
    finally:
        h.close()


def test_a_refusal_naming_a_long_client_id_still_reaches_the_caller(tmp_path):
    h = SecAggHarness(tmp_path, "keys")
    try:
        request = h.request("roster")
        request.client_id = "x" * 40_000  # details over the hard limit too (between 8 and 16 KiB: dropped at random)
        with pytest.raises(grpc.RpcError) as err:
            h.call(request)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED, err.value.details()
    finally:
        h.close()
