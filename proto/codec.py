"""The wire format: conversions between :mod:`common.wire.messages` and ``proto/lorm.proto``.

This is the only module that turns dataclasses into protobuf messages and back; only the
servicer (``server/service.py``) and the client transport (``client/transport.py``) import
it, and everything else sees dataclasses and the flat named tensors of :mod:`common.wire.tensors`.

A tensor travels as a :class:`TensorHeader` (name, dtype, shape, byte size, CRC-32)
declared in the stream's first message, then as :class:`TensorChunk` messages carrying its
raw little-endian bytes in order, ``chunk_bytes`` at a time, so that no message approaches
gRPC's 4 MiB default limit. Pickle is never used: a payload is data, never code. The
receiver (:class:`TensorAssembler`) checks every declared fact before trusting it, and
bounds what it allocates by the declared total, which is itself capped.

Every decoding error is a :class:`WireError` naming the offending field, which the servicer
maps to ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import json
import math
import sys
import zlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import torch
from google.protobuf.message import Message
from torch import Tensor

from common.run.schedule import Schedule, check_schedule
from common.secagg.rounds import Keys
from common.wire.messages import (
    ClientUpdate,
    EvalReport,
    Instruction,
    Phase,
    PullQuery,
    PushEnvelope,
    RoundPlan,
    Wait,
)
from common.wire.tensors import DEFAULT_MAX_TOTAL_BYTES, PARTED, VECTOR, WireError, parse_tensor_name
from proto import lorm_pb2 as pb

if sys.byteorder != "little":  # the wire carries little-endian bytes, copied without swapping
    raise ImportError("proto.codec supports little-endian hosts only")

WIRE_VERSION = 3  # the contract of proto/lorm.proto this codec speaks (its header says what changed)
DEFAULT_CHUNK_BYTES = 1 << 20  # payload per chunk message; well under gRPC's 4 MiB default

# Every channel option once, with why. Chunks are <= 1 MiB, so 8 MiB leaves headroom.
CHANNEL_OPTIONS = [
    ("grpc.max_receive_message_length", 8 * 1024 * 1024),  # one chunk plus its header, with room
    ("grpc.max_send_message_length", 8 * 1024 * 1024),
    ("grpc.keepalive_time_ms", 30_000),  # ping idle connections so NATs keep them open
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),  # allow keepalive pings during long training gaps
    ("grpc.keepalive_permit_without_calls", 1),
    # Redial a restarted coordinator within seconds (gRPC's default backoff grows to 120 s): a
    # client must find it again before its linger ends, e.g. when it restarts into a finished run.
    ("grpc.max_reconnect_backoff_ms", 5_000),
]
DTYPES: dict[str, torch.dtype] = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {dtype: name for name, dtype in DTYPES.items()}


# ------------------------------------------------------------------------ tensor codec


def _raw_bytes(name: str, tensor: Tensor) -> memoryview:
    """The tensor's bytes, row-major; no copy for a contiguous CPU tensor."""
    if tensor.dtype not in _DTYPE_NAMES:
        raise WireError("tensors.dtype", f"expected one of {sorted(DTYPES)}, got {tensor.dtype}", name)
    flat = tensor.detach().cpu().contiguous().reshape(-1)
    return flat.view(torch.uint8).numpy().data  # bytes of any dtype, bfloat16 included


def declared_of(tensors: Mapping[str, Tensor]) -> tuple[dict[str, tuple[str, tuple[int, ...]]], int]:
    """What a push's headers declare of ``tensors``: name -> (dtype name, shape), and their bytes in all (as the
    coordinator's ``precheck`` reads them off the wire)."""
    for name, t in tensors.items():
        if t.dtype not in _DTYPE_NAMES:
            raise WireError("tensors.dtype", f"expected one of {sorted(DTYPES)}, got {t.dtype}", name)
    declared = {name: (_DTYPE_NAMES[t.dtype], tuple(t.shape)) for name, t in tensors.items()}
    return declared, sum(t.numel() * t.element_size() for t in tensors.values())


def _encode(name: str, tensor: Tensor) -> tuple[pb.TensorHeader, memoryview]:
    raw = _raw_bytes(name, tensor)
    header = pb.TensorHeader(
        name=name,
        dtype=_DTYPE_NAMES[tensor.dtype],
        shape=tensor.shape,
        nbytes=raw.nbytes,
        crc32=zlib.crc32(raw),
    )
    return header, raw


def _check_chunk_bytes(chunk_bytes: int) -> None:
    if chunk_bytes <= 0:
        raise ValueError(f"chunk_bytes should be a positive integer, got {chunk_bytes}")


def _raw_chunks(name: str, raw: memoryview, chunk_bytes: int) -> Iterator[pb.TensorChunk]:
    for offset in range(0, raw.nbytes, chunk_bytes):
        yield pb.TensorChunk(name=name, offset=offset, data=bytes(raw[offset : offset + chunk_bytes]))


def tensor_header(name: str, tensor: Tensor) -> pb.TensorHeader:
    """What the receiver is told about ``tensor`` before any of its bytes arrive."""
    return _encode(name, tensor)[0]


def tensor_chunks(name: str, tensor: Tensor, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.TensorChunk]:
    """The tensor's bytes as chunks of at most ``chunk_bytes``; none for an empty tensor."""
    _check_chunk_bytes(chunk_bytes)
    return _raw_chunks(name, _raw_bytes(name, tensor), chunk_bytes)


@dataclass
class _Slot:
    """A declared tensor being received."""

    dtype: torch.dtype
    shape: tuple[int, ...]
    nbytes: int
    crc32: int
    buffer: bytearray | None = None  # allocated at the declared size on the first chunk
    received: int = 0
    running_crc: int = 0


class TensorAssembler:
    """Rebuilds the declared tensors from their chunks, trusting nothing the sender says.

    Headers are checked when the assembler is built (allowed dtype, non-negative shape,
    ``prod(shape) * itemsize == nbytes``, unique names, declared total at most
    ``max_total_bytes``); chunks as they arrive (declared name, offset continuing exactly
    where the tensor's previous chunk ended, no byte past the declared size); the CRC-32
    when a tensor completes; completeness in :meth:`finish`. Each tensor's bytes are held
    once, in a bytearray the returned tensor shares.
    """

    def __init__(self, headers: Iterable[pb.TensorHeader], *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES) -> None:
        self._slots: dict[str, _Slot] = {}
        total = 0
        for header in headers:
            name = header.name
            if not name or name in self._slots:
                raise WireError("tensors.name", "expected a unique non-empty tensor name", name)
            if header.dtype not in DTYPES:
                message = f"expected one of {sorted(DTYPES)}, got {header.dtype!r}"
                raise WireError("tensors.dtype", message, name)
            dtype, shape = DTYPES[header.dtype], list(header.shape)
            if any(d < 0 for d in shape):
                raise WireError("tensors.shape", f"expected non-negative dimensions, got {shape}", name)
            expected = math.prod(shape) * dtype.itemsize
            if header.nbytes != expected:
                message = f"shape {shape} of {header.dtype} is {expected} bytes, header says {header.nbytes}"
                raise WireError("tensors.nbytes", message, name)
            total += expected
            if total > max_total_bytes:
                message = f"declared tensors total {total} bytes or more, over the limit of {max_total_bytes}"
                raise WireError("tensors.nbytes", message, name)
            if expected == 0 and header.crc32 != 0:
                message = f"an empty tensor has CRC-32 0, header says {header.crc32:#010x}"
                raise WireError("tensors.crc32", message, name)
            self._slots[name] = _Slot(dtype, tuple(shape), expected, header.crc32)
        self.total_bytes = total

    def add(self, chunk: pb.TensorChunk) -> None:
        """Copy one chunk into its tensor's buffer."""
        name, data = chunk.name, chunk.data
        slot = self._slots.get(name)
        if slot is None:
            raise WireError("chunk.name", "chunk for a tensor the header did not declare", name)
        if chunk.offset != slot.received:
            message = f"expected offset {slot.received} (chunks in order), got {chunk.offset}"
            raise WireError("chunk.offset", message, name)
        if not data:
            raise WireError("chunk.data", "expected a non-empty chunk", name)
        end = slot.received + len(data)
        if end > slot.nbytes:
            raise WireError("chunk.data", f"chunk ends at byte {end}, past the declared {slot.nbytes}", name)
        if slot.buffer is None:
            slot.buffer = bytearray(slot.nbytes)
        slot.buffer[slot.received : end] = data
        slot.running_crc = zlib.crc32(data, slot.running_crc)
        slot.received = end
        if end == slot.nbytes and slot.running_crc != slot.crc32:
            message = f"header says {slot.crc32:#010x}, the bytes give {slot.running_crc:#010x}"
            raise WireError("tensors.crc32", message, name)

    def finish(self) -> dict[str, Tensor]:
        """All declared tensors, in declaration order; raises if any is incomplete."""
        tensors = {}
        for name, slot in self._slots.items():
            if slot.received != slot.nbytes:
                message = f"stream ended after {slot.received} of {slot.nbytes} bytes"
                raise WireError("chunk.data", message, name)
            if slot.buffer is None:  # empty tensor: there are no bytes to share
                tensors[name] = torch.empty(slot.shape, dtype=slot.dtype)
            else:
                tensors[name] = torch.frombuffer(slot.buffer, dtype=slot.dtype).reshape(slot.shape)
        return tensors


# ----------------------------------------------------------------------------- streams


def _tensor_stream(
    first: Message, encoded: list[tuple[pb.TensorHeader, memoryview]], chunk_bytes: int, wrap: type[Message]
) -> Iterator[Message]:
    """``first``, then every encoded tensor's chunks, each wrapped as ``wrap(chunk=...)``."""
    yield first
    for header, raw in encoded:
        for chunk in _raw_chunks(header.name, raw, chunk_bytes):
            yield wrap(chunk=chunk)


def _open_stream(messages: Iterable[Message], first: str) -> tuple[Message, Iterator[Message]]:
    """The body of the stream's first message (a ``first``) and the rest of the stream."""
    stream = iter(messages)
    head = next(stream, None)
    kind = None if head is None else head.WhichOneof("kind")
    if kind != first:
        got = kind or "an empty stream"
        raise WireError(first, f"expected the stream to start with a {first}, got {got}")
    return getattr(head, first), stream


def _receive(assembler: TensorAssembler, stream: Iterator[Message], first: str) -> dict[str, Tensor]:
    for message in stream:
        if message.WhichOneof("kind") != "chunk":
            raise WireError(first, f"expected one {first}, at the start of the stream; got another")
        assembler.add(message.chunk)
    return assembler.finish()


# ------------------------------------------------------------------------------ enums

_PHASES: dict[Phase, pb.Phase] = {
    Phase.TRAIN: pb.PHASE_TRAIN,
    Phase.TASK_GRAM: pb.PHASE_TASK_GRAM,
    Phase.EVALUATE: pb.PHASE_EVALUATE,
    Phase.DONE: pb.PHASE_DONE,
    Phase.FEATURES: pb.PHASE_FEATURES,
}


def check_wire_version(theirs: int, who: str) -> None:
    """``WireError`` unless ``who`` (the client or the coordinator) speaks this codec's contract; a version-1
    party sends no version (0)."""
    if theirs != WIRE_VERSION:
        spoken = f"version {theirs}" if theirs else "version 1 (it names none)"
        raise WireError(
            "wire_version",
            f"the {who} speaks wire contract {spoken}, this one speaks version {WIRE_VERSION}: run the same "
            "release of lorm on both sides",
        )


def schedule_to_proto(schedule: Schedule | None) -> list[pb.TaskClasses]:
    """``JoinReply.tasks`` of a schedule (none: the configuration names no classes)."""
    return [pb.TaskClasses(classes=task) for task in schedule or []]


def schedule_from_proto(tasks: Iterable[pb.TaskClasses]) -> Schedule | None:
    """The schedule of ``JoinReply.tasks`` (``None`` when it holds none), checked before it is used: tasks of
    classes, each name once, bounded in number and length (``common.run.schedule.check_schedule``)."""
    schedule = [list(task.classes) for task in tasks]
    if not schedule:
        return None
    try:
        check_schedule(schedule, "the run's schedule of classes")
    except ValueError as err:
        raise WireError("tasks", str(err)) from err
    return schedule


def phase_to_proto(phase: Phase) -> pb.Phase:
    return _PHASES[Phase(phase)]


def phase_from_proto(value: int, field: str = "phase") -> Phase:
    """The :class:`Phase` of a wire enum value; ``PHASE_UNSPECIFIED`` and unknown values are errors."""
    return _enum_from_proto(_PHASES, pb.Phase.Name, value, field)


def _enum_from_proto(mapping: Mapping[Any, int], wire_name: Callable[[int], str], value: int, field: str) -> Any:
    for member, wire in mapping.items():
        if wire == value:
            return member
    raise WireError(field, f"expected one of {[wire_name(w) for w in mapping.values()]}, got {value}")


def _non_negative(**values: int) -> None:
    for field, value in values.items():
        if value < 0:
            raise WireError(field, f"expected a non-negative integer, got {value}")


def _non_empty(**values: str) -> None:
    for field, value in values.items():
        if not value:
            raise WireError(field, "expected a non-empty string")


# ------------------------------------------------------------------------------ Pull


def pull_to_proto(query: PullQuery) -> pb.PullRequest:
    request = pb.PullRequest(run_id=query.run_id, client_id=query.client_id)
    if query.last_completed is not None:
        task, round_, phase = query.last_completed
        request.last_completed.CopyFrom(pb.StepRef(task=task, round=round_, phase=phase_to_proto(phase)))
    return request


def pull_from_proto(request: pb.PullRequest) -> PullQuery:
    _non_empty(run_id=request.run_id, client_id=request.client_id)
    last = None
    if request.HasField("last_completed"):
        step = request.last_completed
        _non_negative(**{"last_completed.task": step.task, "last_completed.round": step.round})
        last = (step.task, step.round, phase_from_proto(step.phase, "last_completed.phase"))
    return PullQuery(request.run_id, request.client_id, last)


def wait_to_proto(wait: Wait) -> Iterator[pb.PlanChunk]:
    """A Pull answer with no plan: a single header with ``wait`` set."""
    header = pb.PlanHeader(wait=True, retry_after_s=wait.retry_after_s, wait_reason=wait.reason)
    yield pb.PlanChunk(header=header)


def plan_to_proto(plan: RoundPlan, chunk_bytes: int = DEFAULT_CHUNK_BYTES) -> Iterator[pb.PlanChunk]:
    """The plan as a header (the envelope, the instruction, every tensor declared), then the tensors' chunks.

    Tensors are encoded (and checksummed) before this returns, so a tensor that cannot
    travel raises here rather than in the middle of the stream.
    """
    _check_chunk_bytes(chunk_bytes)
    for name in plan.tensors:
        parse_tensor_name(name)
    encoded = [_encode(name, tensor) for name, tensor in plan.tensors.items()]
    header = pb.PlanHeader(
        run_id=plan.run_id,
        phase=phase_to_proto(plan.phase),
        task=plan.task,
        round=plan.round,
        class_lo=plan.class_range[0],
        class_hi=plan.class_range[1],
        seen_classes=plan.seen_classes,
        seed=plan.seed,
        secure_attempt=plan.secure_attempt,
        instruction=pb.Instruction(kind=plan.instruction.KIND, fields_json=plan.instruction.to_json()),
        tensors=[header for header, _ in encoded],
    )
    return _tensor_stream(pb.PlanChunk(header=header), encoded, chunk_bytes, pb.PlanChunk)


def plan_from_proto(
    messages: Iterable[pb.PlanChunk], *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
) -> RoundPlan | Wait:
    """Inverse of :func:`plan_to_proto` (and of :func:`wait_to_proto`)."""
    header, stream = _open_stream(messages, "header")
    if header.wait:
        if not (math.isfinite(header.retry_after_s) and header.retry_after_s >= 0):
            message = f"expected a finite non-negative delay, got {header.retry_after_s}"
            raise WireError("retry_after_s", message)
        if header.tensors or next(stream, None) is not None:
            raise WireError("wait", "a wait answer carries no tensors")
        return Wait(header.retry_after_s, header.wait_reason)
    _non_empty(run_id=header.run_id)
    _non_negative(
        task=header.task, round=header.round, seen_classes=header.seen_classes, secure_attempt=header.secure_attempt
    )
    phase = phase_from_proto(header.phase)
    if not header.HasField("instruction") and phase != Phase.DONE:
        raise WireError("instruction", f"a {phase.value} plan needs an instruction")
    try:
        instruction = Instruction.from_wire(header.instruction.kind or Instruction.KIND, header.instruction.fields_json)
    except ValueError as err:
        raise WireError("instruction", str(err)) from err
    for h in header.tensors:
        parse_tensor_name(h.name)
    tensors = _receive(TensorAssembler(header.tensors, max_total_bytes=max_total_bytes), stream, "header")
    plan = RoundPlan(
        run_id=header.run_id,
        phase=phase,
        task=header.task,
        round=header.round,
        class_range=(header.class_lo, header.class_hi),
        seen_classes=header.seen_classes,
        instruction=instruction,
        tensors=tensors,
        seed=header.seed,
        secure_attempt=header.secure_attempt,
    )
    for kind in PARTED:
        try:
            plan.by_layer(kind) if kind == VECTOR else plan.low_rank(kind)
        except ValueError as err:
            raise WireError("tensors.name", str(err)) from err
    return plan


# ------------------------------------------------------------------------------ Push


def update_to_proto(
    update: ClientUpdate, idempotency_key: str, chunk_bytes: int = DEFAULT_CHUNK_BYTES
) -> Iterator[pb.UpdateChunk]:
    """The update as an envelope (scalars, every tensor declared), then the tensors' chunks."""
    _check_chunk_bytes(chunk_bytes)
    _non_empty(idempotency_key=idempotency_key)
    for name in update.tensors:
        parse_tensor_name(name)
    encoded = [_encode(name, tensor) for name, tensor in update.tensors.items()]
    envelope = pb.UpdateEnvelope(
        run_id=update.run_id,
        task=update.task,
        round=update.round,
        phase=phase_to_proto(update.phase),
        client_id=update.client_id,
        client_index=update.client_index,
        idempotency_key=idempotency_key,
        num_samples=update.num_samples,
        train_loss=update.train_loss,
        tensors=[header for header, _ in encoded],
        secure_attempt=update.secure_attempt,
    )
    return _tensor_stream(pb.UpdateChunk(envelope=envelope), encoded, chunk_bytes, pb.UpdateChunk)


def update_from_proto(
    messages: Iterable[pb.UpdateChunk],
    *,
    max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES,
    on_envelope: Callable[[PushEnvelope], None] | None = None,
) -> tuple[PushEnvelope, ClientUpdate]:
    """Inverse of :func:`update_to_proto`.

    ``on_envelope`` is called once the envelope and its tensor headers have been checked and
    before any chunk is read, so the caller can reject a stale or duplicate push (by raising)
    without receiving its tensors.
    """
    env, stream = _open_stream(messages, "envelope")
    _non_empty(run_id=env.run_id, client_id=env.client_id, idempotency_key=env.idempotency_key)
    _non_negative(
        client_index=env.client_index,
        task=env.task,
        round=env.round,
        num_samples=env.num_samples,
        secure_attempt=env.secure_attempt,
    )
    for h in env.tensors:
        parse_tensor_name(h.name)
    assembler = TensorAssembler(env.tensors, max_total_bytes=max_total_bytes)
    envelope = PushEnvelope(
        run_id=env.run_id,
        client_id=env.client_id,
        client_index=env.client_index,
        task=env.task,
        round=env.round,
        phase=phase_from_proto(env.phase),
        idempotency_key=env.idempotency_key,
        num_samples=env.num_samples,
        train_loss=env.train_loss,
        total_bytes=assembler.total_bytes,
        declared={h.name: (h.dtype, tuple(h.shape)) for h in env.tensors},
        secure_attempt=env.secure_attempt,
    )
    if on_envelope is not None:
        on_envelope(envelope)
    tensors = _receive(assembler, stream, "envelope")
    update = ClientUpdate(
        tensors=tensors,
        secure_attempt=env.secure_attempt,
        run_id=env.run_id,
        client_id=env.client_id,
        client_index=env.client_index,
        task=env.task,
        round=env.round,
        phase=envelope.phase,
        num_samples=env.num_samples,
        train_loss=env.train_loss,
    )
    return envelope, update


# ------------------------------------------------------------------------ ReportEval


def eval_to_proto(report: EvalReport, idempotency_key: str) -> pb.EvalReport:
    _non_empty(idempotency_key=idempotency_key)
    return pb.EvalReport(
        run_id=report.run_id,
        client_id=report.client_id,
        client_index=report.client_index,
        task=report.task,
        idempotency_key=idempotency_key,
        correct=report.correct,
        total=report.total,
    )


def eval_from_proto(message: pb.EvalReport) -> tuple[str, EvalReport]:
    """Inverse of :func:`eval_to_proto`: ``(idempotency_key, report)``."""
    _non_empty(run_id=message.run_id, client_id=message.client_id, idempotency_key=message.idempotency_key)
    _non_negative(client_index=message.client_index, task=message.task)
    correct, total = list(message.correct), list(message.total)
    for field, counts in (("correct", correct), ("total", total)):
        if len(counts) != message.task + 1:
            raise WireError(field, f"expected one count per task 0..{message.task}, got {len(counts)}")
    for j, (c, t) in enumerate(zip(correct, total)):
        if not 0 <= c <= t:
            raise WireError("correct", f"expected 0 <= correct <= total for task {j}, got {c} of {t}")
    report = EvalReport(message.run_id, message.client_id, message.client_index, message.task, correct, total)
    return message.idempotency_key, report


# ---------------------------------------------------------------------------- Status


def status_to_proto(status: Mapping[str, Any]) -> pb.RunStatus:
    """A view of :meth:`server.coordinator.Coordinator.status` (a client's or the operator's) on the wire."""
    return pb.RunStatus(
        run_id=status["run_id"],
        state=status["state"],
        task=status["task"],
        round=status["round"],
        phase=phase_to_proto(status["phase"]),
        clients_joined=status["clients_joined"],
        clients_done=status["clients_done"],
        metrics_json=json.dumps(status["metrics"]),
    )


def status_from_proto(msg: pb.RunStatus) -> dict[str, Any]:
    """Inverse of :func:`status_to_proto` (the phase by name, the metrics parsed)."""
    return {
        "run_id": msg.run_id,
        "state": msg.state,
        "task": msg.task,
        "round": msg.round,
        "phase": phase_from_proto(msg.phase).value,
        "clients_joined": msg.clients_joined,
        "clients_done": msg.clients_done,
        "metrics": json.loads(msg.metrics_json or "{}"),
    }


# ------------------------------------------------------------------ secure aggregation

# SecAggStage 1..8
SECAGG_STAGES = ("advertise", "roster", "share", "inbox", "unmask", "reveal", "confirm", "confirmations", "blame")
MAX_CERTIFICATE_BYTES = 16 * 1024
MAX_SIGNATURE_BYTES = 512


def secagg_request_to_proto(
    run_id: str,
    client_id: str,
    client_index: int,
    step: tuple[int, int, Phase],
    stage: str,
    keys: Keys | None = None,
    shares: Mapping[int, bytes] | None = None,
    attempt: int = 0,
) -> pb.SecAggRequest:
    task, round_, phase = step
    return pb.SecAggRequest(
        run_id=run_id,
        client_id=client_id,
        client_index=client_index,
        step=pb.StepRef(task=task, round=round_, phase=phase_to_proto(phase)),
        stage=pb.SecAggStage.Value(f"SECAGG_{stage.upper()}"),
        keys=None if keys is None else _keys_to_proto(keys),
        shares=[pb.SecAggShare(peer=j, data=d) for j, d in sorted((shares or {}).items())],
        attempt=attempt,
    )


def secagg_request_from_proto(msg: pb.SecAggRequest) -> dict[str, Any]:
    """The request's fields as :meth:`server.coordinator.Coordinator.secagg` takes them."""
    if not 1 <= msg.stage <= len(SECAGG_STAGES):
        raise WireError("stage", f"expected a secure aggregation stage 1..{len(SECAGG_STAGES)}, got {msg.stage}")
    _non_empty(run_id=msg.run_id, client_id=msg.client_id)
    stage = SECAGG_STAGES[msg.stage - 1]
    if stage == "advertise" and (len(msg.keys.cipher_public) != 32 or len(msg.keys.mask_public) != 32):
        raise WireError("keys", "an advertise carries two 32-byte X25519 public keys")
    if stage == "advertise" and len(msg.keys.commitment) != 32:
        raise WireError("keys", "an advertise carries a 32-byte commitment to the client's own-mask seed")
    if len(msg.keys.certificate) > MAX_CERTIFICATE_BYTES or len(msg.keys.signature) > MAX_SIGNATURE_BYTES:
        raise WireError(
            "keys",
            f"a certificate of at most {MAX_CERTIFICATE_BYTES} bytes and a signature of at most {MAX_SIGNATURE_BYTES}",
        )
    return {
        "client_id": msg.client_id,
        "client_index": msg.client_index,
        "run_id": msg.run_id,
        "step_ref": (msg.step.task, msg.step.round, phase_from_proto(msg.step.phase, "step.phase")),
        "stage": stage,
        "keys": _keys_from_proto(msg.keys) if stage == "advertise" else None,
        "shares": {s.peer: bytes(s.data) for s in msg.shares},
        "attempt": _checked_attempt(msg.attempt),
    }


def _checked_attempt(attempt: int) -> int:
    _non_negative(attempt=attempt)
    return attempt


def secagg_reply_to_proto(reply: Mapping[str, Any]) -> pb.SecAggReply:
    return pb.SecAggReply(
        ready=reply["ready"],
        retry_after_s=reply.get("retry_after_s", 0.0),
        message=reply.get("message", ""),
        roster=[_keys_to_proto(k) for k in reply.get("roster", [])],
        sharers=reply.get("sharers", []),
        shares=[pb.SecAggShare(peer=j, data=d) for j, d in sorted(reply.get("shares", {}).items())],
        survivors=reply.get("survivors", []),
        dropped=reply.get("dropped", []),
    )


def secagg_reply_from_proto(msg: pb.SecAggReply) -> dict[str, Any]:
    return {
        "ready": msg.ready,
        "retry_after_s": msg.retry_after_s,
        "message": msg.message,
        "roster": {k.index: _keys_from_proto(k) for k in msg.roster},
        "sharers": list(msg.sharers),
        "shares": {s.peer: bytes(s.data) for s in msg.shares},
        "survivors": list(msg.survivors),
        "dropped": list(msg.dropped),
    }


def _keys_to_proto(keys: Keys) -> pb.SecAggKeys:
    return pb.SecAggKeys(
        index=keys.index,
        cipher_public=keys.cipher_public,
        mask_public=keys.mask_public,
        commitment=keys.commitment,
        certificate=keys.certificate,
        signature=keys.signature,
    )


def _keys_from_proto(msg: pb.SecAggKeys) -> Keys:
    return Keys(
        msg.index,
        bytes(msg.cipher_public),
        bytes(msg.mask_public),
        bytes(msg.commitment),
        bytes(msg.certificate),
        bytes(msg.signature),
    )
