from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Phase(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PHASE_UNSPECIFIED: _ClassVar[Phase]
    PHASE_TRAIN: _ClassVar[Phase]
    PHASE_TASK_GRAM: _ClassVar[Phase]
    PHASE_EVALUATE: _ClassVar[Phase]
    PHASE_DONE: _ClassVar[Phase]
    PHASE_FEATURES: _ClassVar[Phase]

class SecAggStage(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    SECAGG_UNSPECIFIED: _ClassVar[SecAggStage]
    SECAGG_ADVERTISE: _ClassVar[SecAggStage]
    SECAGG_ROSTER: _ClassVar[SecAggStage]
    SECAGG_SHARE: _ClassVar[SecAggStage]
    SECAGG_INBOX: _ClassVar[SecAggStage]
    SECAGG_UNMASK: _ClassVar[SecAggStage]
    SECAGG_REVEAL: _ClassVar[SecAggStage]
    SECAGG_CONFIRM: _ClassVar[SecAggStage]
    SECAGG_CONFIRMATIONS: _ClassVar[SecAggStage]
    SECAGG_BLAME: _ClassVar[SecAggStage]
PHASE_UNSPECIFIED: Phase
PHASE_TRAIN: Phase
PHASE_TASK_GRAM: Phase
PHASE_EVALUATE: Phase
PHASE_DONE: Phase
PHASE_FEATURES: Phase
SECAGG_UNSPECIFIED: SecAggStage
SECAGG_ADVERTISE: SecAggStage
SECAGG_ROSTER: SecAggStage
SECAGG_SHARE: SecAggStage
SECAGG_INBOX: SecAggStage
SECAGG_UNMASK: SecAggStage
SECAGG_REVEAL: SecAggStage
SECAGG_CONFIRM: SecAggStage
SECAGG_CONFIRMATIONS: SecAggStage
SECAGG_BLAME: SecAggStage

class TensorHeader(_message.Message):
    __slots__ = ("name", "dtype", "shape", "nbytes", "crc32")
    NAME_FIELD_NUMBER: _ClassVar[int]
    DTYPE_FIELD_NUMBER: _ClassVar[int]
    SHAPE_FIELD_NUMBER: _ClassVar[int]
    NBYTES_FIELD_NUMBER: _ClassVar[int]
    CRC32_FIELD_NUMBER: _ClassVar[int]
    name: str
    dtype: str
    shape: _containers.RepeatedScalarFieldContainer[int]
    nbytes: int
    crc32: int
    def __init__(self, name: _Optional[str] = ..., dtype: _Optional[str] = ..., shape: _Optional[_Iterable[int]] = ..., nbytes: _Optional[int] = ..., crc32: _Optional[int] = ...) -> None: ...

class TensorChunk(_message.Message):
    __slots__ = ("name", "offset", "data")
    NAME_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    offset: int
    data: bytes
    def __init__(self, name: _Optional[str] = ..., offset: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class StepRef(_message.Message):
    __slots__ = ("task", "round", "phase")
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    task: int
    round: int
    phase: Phase
    def __init__(self, task: _Optional[int] = ..., round: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ...) -> None: ...

class JoinRequest(_message.Message):
    __slots__ = ("client_id", "requested_index", "wire_version")
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    REQUESTED_INDEX_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    client_id: str
    requested_index: int
    wire_version: int
    def __init__(self, client_id: _Optional[str] = ..., requested_index: _Optional[int] = ..., wire_version: _Optional[int] = ...) -> None: ...

class ModelDescription(_message.Message):
    __slots__ = ("run_id", "client_id", "model_spec_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    MODEL_SPEC_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    client_id: str
    model_spec_json: str
    def __init__(self, run_id: _Optional[str] = ..., client_id: _Optional[str] = ..., model_spec_json: _Optional[str] = ...) -> None: ...

class JoinReply(_message.Message):
    __slots__ = ("run_id", "config_json", "client_index", "num_clients", "wire_version", "tasks")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIG_JSON_FIELD_NUMBER: _ClassVar[int]
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    NUM_CLIENTS_FIELD_NUMBER: _ClassVar[int]
    WIRE_VERSION_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    config_json: str
    client_index: int
    num_clients: int
    wire_version: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskClasses]
    def __init__(self, run_id: _Optional[str] = ..., config_json: _Optional[str] = ..., client_index: _Optional[int] = ..., num_clients: _Optional[int] = ..., wire_version: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskClasses, _Mapping]]] = ...) -> None: ...

class TaskClasses(_message.Message):
    __slots__ = ("classes",)
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    classes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, classes: _Optional[_Iterable[str]] = ...) -> None: ...

class PullRequest(_message.Message):
    __slots__ = ("run_id", "client_id", "last_completed")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    LAST_COMPLETED_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    client_id: str
    last_completed: StepRef
    def __init__(self, run_id: _Optional[str] = ..., client_id: _Optional[str] = ..., last_completed: _Optional[_Union[StepRef, _Mapping]] = ...) -> None: ...

class Instruction(_message.Message):
    __slots__ = ("kind", "fields_json")
    KIND_FIELD_NUMBER: _ClassVar[int]
    FIELDS_JSON_FIELD_NUMBER: _ClassVar[int]
    kind: str
    fields_json: str
    def __init__(self, kind: _Optional[str] = ..., fields_json: _Optional[str] = ...) -> None: ...

class PlanHeader(_message.Message):
    __slots__ = ("wait", "retry_after_s", "wait_reason", "run_id", "phase", "task", "round", "class_lo", "class_hi", "seen_classes", "seed", "tensors", "secure_attempt", "instruction")
    WAIT_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    WAIT_REASON_FIELD_NUMBER: _ClassVar[int]
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    CLASS_LO_FIELD_NUMBER: _ClassVar[int]
    CLASS_HI_FIELD_NUMBER: _ClassVar[int]
    SEEN_CLASSES_FIELD_NUMBER: _ClassVar[int]
    SEED_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SECURE_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    INSTRUCTION_FIELD_NUMBER: _ClassVar[int]
    wait: bool
    retry_after_s: float
    wait_reason: str
    run_id: str
    phase: Phase
    task: int
    round: int
    class_lo: int
    class_hi: int
    seen_classes: int
    seed: int
    tensors: _containers.RepeatedCompositeFieldContainer[TensorHeader]
    secure_attempt: int
    instruction: Instruction
    def __init__(self, wait: bool = ..., retry_after_s: _Optional[float] = ..., wait_reason: _Optional[str] = ..., run_id: _Optional[str] = ..., phase: _Optional[_Union[Phase, str]] = ..., task: _Optional[int] = ..., round: _Optional[int] = ..., class_lo: _Optional[int] = ..., class_hi: _Optional[int] = ..., seen_classes: _Optional[int] = ..., seed: _Optional[int] = ..., tensors: _Optional[_Iterable[_Union[TensorHeader, _Mapping]]] = ..., secure_attempt: _Optional[int] = ..., instruction: _Optional[_Union[Instruction, _Mapping]] = ...) -> None: ...

class PlanChunk(_message.Message):
    __slots__ = ("header", "chunk")
    HEADER_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    header: PlanHeader
    chunk: TensorChunk
    def __init__(self, header: _Optional[_Union[PlanHeader, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class UpdateEnvelope(_message.Message):
    __slots__ = ("run_id", "task", "round", "phase", "client_id", "client_index", "idempotency_key", "num_samples", "train_loss", "tensors", "secure_attempt")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    NUM_SAMPLES_FIELD_NUMBER: _ClassVar[int]
    TRAIN_LOSS_FIELD_NUMBER: _ClassVar[int]
    TENSORS_FIELD_NUMBER: _ClassVar[int]
    SECURE_ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    task: int
    round: int
    phase: Phase
    client_id: str
    client_index: int
    idempotency_key: str
    num_samples: int
    train_loss: float
    tensors: _containers.RepeatedCompositeFieldContainer[TensorHeader]
    secure_attempt: int
    def __init__(self, run_id: _Optional[str] = ..., task: _Optional[int] = ..., round: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ..., client_id: _Optional[str] = ..., client_index: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., num_samples: _Optional[int] = ..., train_loss: _Optional[float] = ..., tensors: _Optional[_Iterable[_Union[TensorHeader, _Mapping]]] = ..., secure_attempt: _Optional[int] = ...) -> None: ...

class UpdateChunk(_message.Message):
    __slots__ = ("envelope", "chunk")
    ENVELOPE_FIELD_NUMBER: _ClassVar[int]
    CHUNK_FIELD_NUMBER: _ClassVar[int]
    envelope: UpdateEnvelope
    chunk: TensorChunk
    def __init__(self, envelope: _Optional[_Union[UpdateEnvelope, _Mapping]] = ..., chunk: _Optional[_Union[TensorChunk, _Mapping]] = ...) -> None: ...

class PushReply(_message.Message):
    __slots__ = ("accepted", "duplicate", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    duplicate: bool
    message: str
    def __init__(self, accepted: bool = ..., duplicate: bool = ..., message: _Optional[str] = ...) -> None: ...

class EvalReport(_message.Message):
    __slots__ = ("run_id", "client_id", "client_index", "task", "idempotency_key", "correct", "total")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    IDEMPOTENCY_KEY_FIELD_NUMBER: _ClassVar[int]
    CORRECT_FIELD_NUMBER: _ClassVar[int]
    TOTAL_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    client_id: str
    client_index: int
    task: int
    idempotency_key: str
    correct: _containers.RepeatedScalarFieldContainer[int]
    total: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, run_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_index: _Optional[int] = ..., task: _Optional[int] = ..., idempotency_key: _Optional[str] = ..., correct: _Optional[_Iterable[int]] = ..., total: _Optional[_Iterable[int]] = ...) -> None: ...

class Ack(_message.Message):
    __slots__ = ("accepted", "duplicate", "message")
    ACCEPTED_FIELD_NUMBER: _ClassVar[int]
    DUPLICATE_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    accepted: bool
    duplicate: bool
    message: str
    def __init__(self, accepted: bool = ..., duplicate: bool = ..., message: _Optional[str] = ...) -> None: ...

class StatusRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class RunStatus(_message.Message):
    __slots__ = ("run_id", "state", "task", "round", "phase", "clients_joined", "clients_done", "metrics_json")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    TASK_FIELD_NUMBER: _ClassVar[int]
    ROUND_FIELD_NUMBER: _ClassVar[int]
    PHASE_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_JOINED_FIELD_NUMBER: _ClassVar[int]
    CLIENTS_DONE_FIELD_NUMBER: _ClassVar[int]
    METRICS_JSON_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    state: str
    task: int
    round: int
    phase: Phase
    clients_joined: int
    clients_done: int
    metrics_json: str
    def __init__(self, run_id: _Optional[str] = ..., state: _Optional[str] = ..., task: _Optional[int] = ..., round: _Optional[int] = ..., phase: _Optional[_Union[Phase, str]] = ..., clients_joined: _Optional[int] = ..., clients_done: _Optional[int] = ..., metrics_json: _Optional[str] = ...) -> None: ...

class AddTaskRequest(_message.Message):
    __slots__ = ("run_id", "classes")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLASSES_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    classes: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, run_id: _Optional[str] = ..., classes: _Optional[_Iterable[str]] = ...) -> None: ...

class AddTaskReply(_message.Message):
    __slots__ = ("task", "tasks")
    TASK_FIELD_NUMBER: _ClassVar[int]
    TASKS_FIELD_NUMBER: _ClassVar[int]
    task: int
    tasks: _containers.RepeatedCompositeFieldContainer[TaskClasses]
    def __init__(self, task: _Optional[int] = ..., tasks: _Optional[_Iterable[_Union[TaskClasses, _Mapping]]] = ...) -> None: ...

class FinishRequest(_message.Message):
    __slots__ = ("run_id",)
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    def __init__(self, run_id: _Optional[str] = ...) -> None: ...

class SecAggKeys(_message.Message):
    __slots__ = ("index", "cipher_public", "mask_public", "commitment", "certificate", "signature")
    INDEX_FIELD_NUMBER: _ClassVar[int]
    CIPHER_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    MASK_PUBLIC_FIELD_NUMBER: _ClassVar[int]
    COMMITMENT_FIELD_NUMBER: _ClassVar[int]
    CERTIFICATE_FIELD_NUMBER: _ClassVar[int]
    SIGNATURE_FIELD_NUMBER: _ClassVar[int]
    index: int
    cipher_public: bytes
    mask_public: bytes
    commitment: bytes
    certificate: bytes
    signature: bytes
    def __init__(self, index: _Optional[int] = ..., cipher_public: _Optional[bytes] = ..., mask_public: _Optional[bytes] = ..., commitment: _Optional[bytes] = ..., certificate: _Optional[bytes] = ..., signature: _Optional[bytes] = ...) -> None: ...

class SecAggShare(_message.Message):
    __slots__ = ("peer", "data")
    PEER_FIELD_NUMBER: _ClassVar[int]
    DATA_FIELD_NUMBER: _ClassVar[int]
    peer: int
    data: bytes
    def __init__(self, peer: _Optional[int] = ..., data: _Optional[bytes] = ...) -> None: ...

class SecAggRequest(_message.Message):
    __slots__ = ("run_id", "client_id", "client_index", "step", "stage", "keys", "shares", "attempt")
    RUN_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_INDEX_FIELD_NUMBER: _ClassVar[int]
    STEP_FIELD_NUMBER: _ClassVar[int]
    STAGE_FIELD_NUMBER: _ClassVar[int]
    KEYS_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    ATTEMPT_FIELD_NUMBER: _ClassVar[int]
    run_id: str
    client_id: str
    client_index: int
    step: StepRef
    stage: SecAggStage
    keys: SecAggKeys
    shares: _containers.RepeatedCompositeFieldContainer[SecAggShare]
    attempt: int
    def __init__(self, run_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_index: _Optional[int] = ..., step: _Optional[_Union[StepRef, _Mapping]] = ..., stage: _Optional[_Union[SecAggStage, str]] = ..., keys: _Optional[_Union[SecAggKeys, _Mapping]] = ..., shares: _Optional[_Iterable[_Union[SecAggShare, _Mapping]]] = ..., attempt: _Optional[int] = ...) -> None: ...

class SecAggReply(_message.Message):
    __slots__ = ("ready", "retry_after_s", "message", "roster", "sharers", "shares", "survivors", "dropped")
    READY_FIELD_NUMBER: _ClassVar[int]
    RETRY_AFTER_S_FIELD_NUMBER: _ClassVar[int]
    MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ROSTER_FIELD_NUMBER: _ClassVar[int]
    SHARERS_FIELD_NUMBER: _ClassVar[int]
    SHARES_FIELD_NUMBER: _ClassVar[int]
    SURVIVORS_FIELD_NUMBER: _ClassVar[int]
    DROPPED_FIELD_NUMBER: _ClassVar[int]
    ready: bool
    retry_after_s: float
    message: str
    roster: _containers.RepeatedCompositeFieldContainer[SecAggKeys]
    sharers: _containers.RepeatedScalarFieldContainer[int]
    shares: _containers.RepeatedCompositeFieldContainer[SecAggShare]
    survivors: _containers.RepeatedScalarFieldContainer[int]
    dropped: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, ready: bool = ..., retry_after_s: _Optional[float] = ..., message: _Optional[str] = ..., roster: _Optional[_Iterable[_Union[SecAggKeys, _Mapping]]] = ..., sharers: _Optional[_Iterable[int]] = ..., shares: _Optional[_Iterable[_Union[SecAggShare, _Mapping]]] = ..., survivors: _Optional[_Iterable[int]] = ..., dropped: _Optional[_Iterable[int]] = ...) -> None: ...
