"""What crosses between the ServerApp and a ClientApp, as Flower records: the project's own wire messages.

A plan, an update and an evaluation report travel as the protobuf messages that the gRPC coordinator sends and
receives (``proto/codec.py``), serialised into one ``ConfigRecord`` of bytes. The receiving side decodes them with
the same decoder and the same bounds as over gRPC (tensor names, declared shapes, a cap on the bytes), so nothing a
hostile node or ServerApp could send here is read more trustingly than it would be off the native wire. What a
client needs to set itself up (the run's configuration, its schedule of classes, the slot it holds) goes with every
plan: a ClientApp process that Flower started for this one message has nothing else to go by.
"""

from __future__ import annotations

from collections.abc import Iterable

from flwr.app import ConfigRecord, RecordDict

from common.run.config import RunConfig
from common.run.schedule import Schedule
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase, RoundPlan
from proto import codec
from proto import lorm_pb2 as pb

WIRE = "lorm"  # the record of the project's own messages
RUN = "lorm.run"  # the run as the coordinator's Join reply states it


def message_type(phase: Phase) -> str:
    """The Flower message type of a step of ``phase``: the category a ClientApp routes it by (train, query,
    evaluate), its action the phase."""
    if phase == Phase.TRAIN:
        return "train.lorm"
    if phase == Phase.EVALUATE:
        return "evaluate.lorm"
    return f"query.{phase.value.replace('-', '_')}"


def _chunks(messages: Iterable[pb.PlanChunk | pb.UpdateChunk]) -> list[bytes]:
    return [m.SerializeToString() for m in messages]


def client_id(node_id: int) -> str:
    """A node's identity in the run: its node id, which the SuperLink authenticated (both apps name it so)."""
    return f"node-{node_id}"


def integer(record: ConfigRecord, key: str) -> int:
    """``record[key]`` as an int (``ValueError`` for anything else: a hostile party's record is not trusted)."""
    value = record.get(key)
    if not isinstance(value, int) or isinstance(value, bool):
        raise ValueError(f"{key}: expected an integer, got {type(value).__name__}")
    return value


def text(record: ConfigRecord, key: str) -> str:
    value = record.get(key)
    if not isinstance(value, str):
        raise ValueError(f"{key}: expected a string, got {type(value).__name__}")
    return value


def blobs(record: ConfigRecord, key: str) -> list[bytes]:
    """``record[key]`` as a list of byte strings (one serialised message each)."""
    value = record.get(key, [])
    if isinstance(value, bytes):
        return [value]
    if not isinstance(value, list) or not all(isinstance(b, bytes) for b in value):
        raise ValueError(f"{key}: expected bytes, got {type(value).__name__}")
    return [b for b in value if isinstance(b, bytes)]


def run_record(config: RunConfig, schedule: Schedule | None, index: int) -> ConfigRecord:
    """What a Join reply carries: the run's configuration and schedule as they stand, and this client's slot."""
    tasks = [t.SerializeToString() for t in codec.schedule_to_proto(schedule)]
    return ConfigRecord({"config": config.to_json(), "index": index, "tasks": tasks, "wire": codec.WIRE_VERSION})


def run_from_record(record: ConfigRecord) -> tuple[RunConfig, Schedule | None, int]:
    codec.check_wire_version(integer(record, "wire"), "ServerApp")
    tasks = [pb.TaskClasses.FromString(b) for b in blobs(record, "tasks")]
    return RunConfig.from_json(text(record, "config")), codec.schedule_from_proto(tasks), integer(record, "index")


def plan_content(plan: RoundPlan, run: ConfigRecord) -> RecordDict:
    return RecordDict({WIRE: ConfigRecord({"plan": _chunks(codec.plan_to_proto(plan))}), RUN: run})


def plan_from_content(content: RecordDict) -> RoundPlan:
    """The plan a message carries, bounded as ``lorm-client`` bounds a pulled one (the codec's default)."""
    chunks = (pb.PlanChunk.FromString(b) for b in blobs(wire(content), "plan"))
    plan = codec.plan_from_proto(chunks)
    if not isinstance(plan, RoundPlan):
        raise ValueError("a Flower message carries a plan, not a wait")
    return plan


def update_content(update: ClientUpdate, key: str) -> RecordDict:
    return RecordDict({WIRE: ConfigRecord({"update": _chunks(codec.update_to_proto(update, key))})})


def report_content(report: EvalReport, key: str) -> RecordDict:
    return RecordDict({WIRE: ConfigRecord({"report": codec.eval_to_proto(report, key).SerializeToString()})})


def spec_content(spec: ModelSpec) -> RecordDict:
    return RecordDict({WIRE: ConfigRecord({"spec": spec.to_json()})})


def wire(content: RecordDict) -> ConfigRecord:
    """The project's record of a reply (``ValueError`` if it has none)."""
    if WIRE not in content.config_records:
        raise ValueError(f"the reply carries no {WIRE!r} record")
    return content.config_records[WIRE]


def update_chunks(record: ConfigRecord) -> Iterable[pb.UpdateChunk]:
    return (pb.UpdateChunk.FromString(b) for b in blobs(record, "update"))


def report_message(record: ConfigRecord) -> pb.EvalReport:
    return pb.EvalReport.FromString(blobs(record, "report")[0])
