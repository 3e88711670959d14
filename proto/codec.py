"""The wire format of the run's envelopes: conversions between :mod:`common.wire.messages` and ``proto/lorm.proto``.

This module and its siblings are the only ones that turn dataclasses into protobuf messages and back;
only the transports (``server/service.py``, ``client/transport.py``, ``engine/transport.py``) and the
operator's command (``server/admin.py``) import them, and everything else sees dataclasses and the
flat named tensors of :mod:`common.wire.tensors`. Here: the contract's version and channel options,
the Join handshake's schedule, and the Pull, Push and ReportEval envelopes, whose tensors travel as
the stream of :mod:`proto.streams`. The secure-aggregation calls are in :mod:`proto.secagg_codec`, the
run's status in :mod:`proto.status_codec`, and the enums and field checks they share in
:mod:`proto.fields`.

Every decoding error is a :class:`WireError` naming the offending field, which the servicer
maps to ``INVALID_ARGUMENT``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator

from common.methods import registry
from common.run.schedule import Schedule, check_schedule
from common.wire.instructions import Instruction
from common.wire.messages import ClientUpdate, EvalReport, Phase, PullQuery, PushEnvelope, RoundPlan, Wait
from common.wire.tensors import DEFAULT_MAX_TOTAL_BYTES, PARTED, VECTOR, WireError, parse_tensor_name
from proto import lorm_pb2 as pb
from proto.fields import non_empty, non_negative, phase_from_proto, phase_to_proto
from proto.streams import (
    DEFAULT_CHUNK_BYTES,
    TensorAssembler,
    check_chunk_bytes,
    encode,
    open_stream,
    receive,
    tensor_stream,
)

WIRE_VERSION = 3  # the contract of proto/lorm.proto this codec speaks (its header says what changed)

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


# ------------------------------------------------------------------------------ Join


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


# ------------------------------------------------------------------------------ Pull


def pull_to_proto(query: PullQuery) -> pb.PullRequest:
    request = pb.PullRequest(run_id=query.run_id, client_id=query.client_id)
    if query.last_completed is not None:
        task, round_, phase = query.last_completed
        request.last_completed.CopyFrom(pb.StepRef(task=task, round=round_, phase=phase_to_proto(phase)))
    return request


def pull_from_proto(request: pb.PullRequest) -> PullQuery:
    non_empty(run_id=request.run_id, client_id=request.client_id)
    last = None
    if request.HasField("last_completed"):
        step = request.last_completed
        non_negative(**{"last_completed.task": step.task, "last_completed.round": step.round})
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
    check_chunk_bytes(chunk_bytes)
    for name in plan.tensors:
        parse_tensor_name(name)
    encoded = [encode(name, tensor) for name, tensor in plan.tensors.items()]
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
    return tensor_stream(pb.PlanChunk(header=header), encoded, chunk_bytes, pb.PlanChunk)


def plan_from_proto(
    messages: Iterable[pb.PlanChunk], *, max_total_bytes: int = DEFAULT_MAX_TOTAL_BYTES
) -> RoundPlan | Wait:
    """Inverse of :func:`plan_to_proto` (and of :func:`wait_to_proto`)."""
    header, stream = open_stream(messages, "header")
    if header.wait:
        if not (math.isfinite(header.retry_after_s) and header.retry_after_s >= 0):
            message = f"expected a finite non-negative delay, got {header.retry_after_s}"
            raise WireError("retry_after_s", message)
        if header.tensors or next(stream, None) is not None:
            raise WireError("wait", "a wait answer carries no tensors")
        return Wait(header.retry_after_s, header.wait_reason)
    non_empty(run_id=header.run_id)
    non_negative(
        task=header.task, round=header.round, seen_classes=header.seen_classes, secure_attempt=header.secure_attempt
    )
    phase = phase_from_proto(header.phase)
    if not header.HasField("instruction") and phase != Phase.DONE:
        raise WireError("instruction", f"a {phase.value} plan needs an instruction")
    try:
        instruction = Instruction.from_wire(
            header.instruction.kind or Instruction.KIND, header.instruction.fields_json, registry
        )
    except ValueError as err:
        raise WireError("instruction", str(err)) from err
    for h in header.tensors:
        parse_tensor_name(h.name)
    tensors = receive(TensorAssembler(header.tensors, max_total_bytes=max_total_bytes), stream, "header")
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
    check_chunk_bytes(chunk_bytes)
    non_empty(idempotency_key=idempotency_key)
    for name in update.tensors:
        parse_tensor_name(name)
    encoded = [encode(name, tensor) for name, tensor in update.tensors.items()]
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
    return tensor_stream(pb.UpdateChunk(envelope=envelope), encoded, chunk_bytes, pb.UpdateChunk)


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
    env, stream = open_stream(messages, "envelope")
    non_empty(run_id=env.run_id, client_id=env.client_id, idempotency_key=env.idempotency_key)
    non_negative(
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
    tensors = receive(assembler, stream, "envelope")
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
    non_empty(idempotency_key=idempotency_key)
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
    non_empty(run_id=message.run_id, client_id=message.client_id, idempotency_key=message.idempotency_key)
    non_negative(client_index=message.client_index, task=message.task)
    correct, total = list(message.correct), list(message.total)
    for field, counts in (("correct", correct), ("total", total)):
        if len(counts) != message.task + 1:
            raise WireError(field, f"expected one count per task 0..{message.task}, got {len(counts)}")
    for j, (c, t) in enumerate(zip(correct, total)):
        if not 0 <= c <= t:
            raise WireError("correct", f"expected 0 <= correct <= total for task {j}, got {c} of {t}")
    report = EvalReport(message.run_id, message.client_id, message.client_index, message.task, correct, total)
    return message.idempotency_key, report
