"""What travels between coordinator and clients, as plain dataclasses of tensors.

Only the gRPC servicer and the client transport translate these to and from protobuf; the
engine, the strategies and the client trainer see nothing but these types. The in-process
engine passes them by reference, the distributed system over the wire: same objects, same
math.

Layer names are the dotted module names of the wrapped ``nn.Linear`` layers in the backbone
(e.g. ``encoder.layer.0.attention.self.query``). Factor shapes: ``B: (d_out, r)``,
``A: (r, d_in)``; Grams ``(d_in,)`` (diagonal) or ``(d_in, d_in)`` (full).

This module holds the envelopes (a step's plan, a client's update and report, the step protocol around a Pull
and a Push) and the model's description; what a step asks of a client inside its plan, its instruction, is the
sibling :mod:`common.wire.instructions`.
"""

from __future__ import annotations

import dataclasses
import json
import math
import typing
from collections import Counter
from dataclasses import dataclass, field
from enum import Enum
from typing import ClassVar

from torch import Tensor

from common.wire.instructions import Instruction, Mode
from common.wire.tensors import PARTS


class Phase(str, Enum):
    """What a client is asked to do."""

    TRAIN = "train"  # local training of the listed factors + head, then (optionally) a Gram pass
    TASK_GRAM = "task_gram"  # end of task: a Gram pass only, no training
    FEATURES = "features"  # no training: statistics of the task's features (closed-form heads)
    EVALUATE = "evaluate"  # evaluate the published model on the client's test share
    DONE = "done"  # the run is over


MAX_CLASS_NAME = 1_000  # characters of a class name a description may hold (the schedule's bound, MAX_NAME)


@dataclass(frozen=True)
class ModelSpec:
    """What the coordinator must know about the model; it never builds one itself.

    ``classes`` and ``max_length`` are what only the clients know (they read the data): the class names in head
    order, and the tokens a sentence keeps (``max_length=0`` lets the clients count it from their data). They
    travel in the same JSON as the shapes; a description without them (``None``: an older client, state
    directory or ``--model-spec`` file) reads as not knowing them, and the first one that knows them completes
    it (:meth:`completed_by`)."""

    layers: dict[str, tuple[int, int]]  # LoRA layer name -> (d_out, d_in), in module order
    feature_dim: int  # the head's input width
    num_classes: int  # the head's output width (all classes of all tasks)
    export_prefix: str = ""  # prefix of layer names inside the wrapper, stripped for the exported adapter
    base_model: str = ""  # what the exported adapter applies to (hub name or local path)
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)  # backbone weights (full fine-tuning)
    # head row i is class classes[i]; None: unknown, or named by the coordinator's schedule (clients' own data)
    classes: tuple[str, ...] | None = None
    max_length: int | None = None  # text: tokens kept per sample; 0: the model reads no text; None: unknown

    KNOWN_LATER: ClassVar[tuple[str, ...]] = ("classes", "max_length")  # fields an older description lacks

    def to_json(self) -> str:
        return json.dumps(
            {
                "layers": {k: list(v) for k, v in self.layers.items()},
                "feature_dim": self.feature_dim,
                "num_classes": self.num_classes,
                "export_prefix": self.export_prefix,
                "base_model": self.base_model,
                "params": {k: list(v) for k, v in self.params.items()},
                "classes": None if self.classes is None else list(self.classes),
                "max_length": self.max_length,
            }
        )

    def difference(self, other: ModelSpec) -> str:
        """The first way ``other`` differs from this spec, in words ("" when equal)."""
        for what in ("feature_dim", "num_classes", "export_prefix", "base_model", "max_length"):
            if getattr(self, what) != getattr(other, what):
                return f"{what} {getattr(other, what)!r} instead of {getattr(self, what)!r}"
        for what in ("layers", "params"):
            mine, theirs = getattr(self, what), getattr(other, what)
            if list(mine) != list(theirs):
                extra, missing = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
                return (
                    f"{what}: {len(theirs)} instead of {len(mine)}, unexpected {extra[:3]}, missing {missing[:3]}"
                    if extra or missing
                    else f"{what} in another order"
                )
            for name, shape in mine.items():
                if tuple(theirs[name]) != tuple(shape):
                    return f"{what} {name!r} of shape {tuple(theirs[name])} instead of {tuple(shape)}"
        return _class_difference(self.classes, other.classes)

    def completed_by(self, other: ModelSpec) -> bool:
        """Whether ``other`` is this description with what this one does not know (:data:`KNOWN_LATER` fields
        that are ``None``) filled in: the same model, described by a client that knows more."""
        unknown = {what: getattr(other, what) for what in self.KNOWN_LATER if getattr(self, what) is None}
        return bool(unknown) and dataclasses.replace(self, **unknown) == other

    def state_bytes(self, rank: int, full_grams: bool) -> int:
        """An upper bound of the bytes the coordinator holds for one step of this model: float64 LoRA factors
        ``(d_out + d_in) r`` and Grams (``d_in`` or ``d_in^2``) per layer, backbone parameters, head and its Gram."""
        per_layer = sum(
            (d_out + d_in) * rank + (d_in * d_in if full_grams else d_in) for d_out, d_in in self.layers.values()
        )
        params = sum(math.prod(shape) for shape in self.params.values())
        head = self.num_classes * (self.feature_dim + 1) + self.feature_dim * self.feature_dim
        return 8 * (per_layer + params + head)

    @classmethod
    def from_json(cls, text: str) -> ModelSpec:
        """Inverse of :meth:`to_json`; ``ValueError`` for anything that is not a model description. A field
        this reader does not know is ignored; ``classes`` and ``max_length`` absent read as unknown."""
        try:
            v = json.loads(text)
            layers = {str(k): (int(s[0]), int(s[1])) for k, s in v["layers"].items()}
            params = {str(k): tuple(int(d) for d in s) for k, s in v.get("params", {}).items()}
            classes, max_length = v.get("classes"), v.get("max_length")
            if classes is not None and (not isinstance(classes, list) or len(classes) != int(v["num_classes"])):
                raise TypeError(f"classes: expected a list of a name per head row, got {str(classes):.100}")
            spec = cls(
                layers,
                int(v["feature_dim"]),
                int(v["num_classes"]),
                str(v.get("export_prefix", "")),
                str(v.get("base_model", "")),
                params,
                None if classes is None else tuple(classes),
                None if max_length is None else int(max_length),
            )
        except (ValueError, KeyError, TypeError, IndexError, AttributeError, OverflowError, RecursionError) as err:
            raise ValueError(f"not a model description ({type(err).__name__}: {err})") from err
        sizes = [d for shape in spec.layers.values() for d in shape] + [spec.feature_dim, spec.num_classes]
        if min(sizes) < 1 or any(d < 0 for shape in spec.params.values() for d in shape):
            raise ValueError(
                f"expected positive layer sizes, feature_dim and num_classes and non-negative "
                f"parameter dimensions, got layers {spec.layers}, feature_dim {spec.feature_dim}, "
                f"num_classes {spec.num_classes}"
            )
        if spec.max_length is not None and spec.max_length < 0:
            raise ValueError(f"max_length should be 0 (no text) or a positive token count, got {spec.max_length}")
        if spec.classes is not None:
            _check_names(spec.classes)
        return spec


def _check_names(names: tuple[str, ...]) -> None:
    """``ValueError`` unless every name is a string of 1 to :data:`MAX_CLASS_NAME` characters, none twice."""
    bad = [n for n in names if not isinstance(n, str) or not 1 <= len(n) <= MAX_CLASS_NAME]
    if bad:
        raise ValueError(f"class names are strings of 1 to {MAX_CLASS_NAME} characters, got {bad[:3]!r:.200}")
    repeated = sorted(n for n, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"class names repeat: {repeated[:5]!r:.200}")


def _class_difference(mine: tuple[str, ...] | None, theirs: tuple[str, ...] | None) -> str:
    """How the class names ``theirs`` differ from ``mine`` (head order), in words ("" when equal)."""
    if mine == theirs:
        return ""
    if mine is None or theirs is None:
        return f"classes {'unknown' if theirs is None else 'named'} instead of {'unknown' if mine is None else 'named'}"
    if sorted(mine) == sorted(theirs):
        row = next(i for i, (a, b) in enumerate(zip(mine, theirs)) if a != b)
        return f"classes in another order: head row {row} is {theirs[row]!r} instead of {mine[row]!r}"
    extra, missing = sorted(set(theirs) - set(mine)), sorted(set(mine) - set(theirs))
    return f"classes: unexpected {extra[:3]!r:.300}, missing {missing[:3]!r:.300}"


@dataclass
class LowRank:
    """A low-rank delta ``B @ A``: ``B: (d_out, k)``, ``A: (k, d_in)``."""

    b: Tensor
    a: Tensor


# The keys of a distilling method's (LwF, TARGET) ``anchor`` tensors that hold the previous task's global
# head (weight, bias): the teacher's own, fixed for the task. The plan's head moves during the task (the
# distillation trains the old classes' rows), so the teacher cannot take it. Backbone names never hold "/".
ANCHOR_HEAD = ("head/weight", "head/bias")


# ----------------------------------------------------------------------- the envelopes


Step = typing.TypeVar("Step", bound=Instruction)


class Tensors:
    """Named tensors (``<kind>/<name>`` or ``<kind>/<layer>/<part>``, :mod:`common.wire.tensors`) read by kind."""

    tensors: dict[str, Tensor]

    def named(self, kind: str) -> dict[str, Tensor]:
        """``name -> tensor`` of every ``<kind>/<name>`` tensor (the name may hold further ``/``)."""
        prefix = kind + "/"
        return {name[len(prefix) :]: t for name, t in self.tensors.items() if name.startswith(prefix)}

    def by_layer(self, kind: str) -> dict[str, dict[str, Tensor]]:
        """``layer -> part -> tensor`` of every ``<kind>/<layer>/<part>`` tensor."""
        out: dict[str, dict[str, Tensor]] = {}
        for rest, t in self.named(kind).items():
            layer, _, part = rest.rpartition("/")
            out.setdefault(layer, {})[part] = t
        return out

    def low_rank(self, kind: str) -> dict[str, LowRank]:
        """``layer -> LowRank`` of every ``<kind>/<layer>/B`` and ``/A`` pair; ``ValueError`` for a half pair."""
        out = {}
        for layer, parts in self.by_layer(kind).items():
            if set(parts) != set(PARTS):
                raise ValueError(f"{kind} layer {layer!r} needs both B and A, got {sorted(parts)}")
            out[layer] = LowRank(b=parts["B"], a=parts["A"])
        return out

    def get(self, name: str) -> Tensor | None:
        return self.tensors.get(name)


@dataclass
class RoundPlan(Tensors):
    """Everything a client needs for one step of the run (what it pulls): who and which step, the step's
    instruction, and named tensors (the shared factors ``lora/*``, the frozen delta ``extra/*``, the head
    ``head/weight`` and ``head/bias``, and whatever else the method hands out)."""

    run_id: str
    phase: Phase
    task: int  # 0-based task index
    round: int  # 0-based round within the task (TASK_GRAM/EVALUATE and a LoRM features step: the number of rounds)
    class_range: tuple[int, int]  # [lo, hi): the current task's classes
    seen_classes: int  # classes 0..seen_classes-1 are scored at evaluation
    instruction: Instruction = field(default_factory=Instruction)
    tensors: dict[str, Tensor] = field(default_factory=dict)
    seed: int = 0  # seed for this client step (combined with the client index)
    # secure aggregation: which session of the step's (0; the coordinator starts a fresh one, 1, 2, ..., when
    # fewer than the threshold of a round's clients answered and enough others ask to take part)
    secure_attempt: int = 0

    @property
    def mode(self) -> Mode | None:
        """The kind of client half the step asks for (its instruction's ``MODE``; ``None``: no step)."""
        return self.instruction.MODE

    def expect(self, kind: type[Step]) -> Step:
        """The plan's instruction as a ``kind``; ``ValueError`` when the step asks for something else."""
        step = self.instruction
        if not isinstance(step, kind):
            raise ValueError(f"this step asks for a {type(step).__name__} ({step.KIND!r}), not a {kind.__name__}")
        return step


@dataclass
class ClientUpdate(Tensors):
    """What a client pushes after a TRAIN, TASK_GRAM or FEATURES step: who, which step, its sample count and
    loss, and named tensors (what the step declares, ``common/aggregation/declared.py``)."""

    run_id: str
    client_id: str
    client_index: int
    task: int
    round: int
    phase: Phase
    num_samples: int  # training samples of the current task on this client
    tensors: dict[str, Tensor] = field(default_factory=dict)
    train_loss: float = float("nan")  # mean training loss over the last local epoch
    secure_attempt: int = 0  # secure aggregation: the step's session the masks were made for (RoundPlan's)

    @classmethod
    def of_step(
        cls,
        plan: RoundPlan,
        client_index: int,
        client_id: str,
        num_samples: int,
        tensors: dict[str, Tensor],
        train_loss: float = float("nan"),
    ) -> ClientUpdate:
        """Client ``client_index``'s (``client_id``) update of ``plan``'s step: its run, task, round and phase."""
        return cls(
            run_id=plan.run_id,
            client_id=client_id,
            client_index=client_index,
            task=plan.task,
            round=plan.round,
            phase=plan.phase,
            num_samples=num_samples,
            tensors=tensors,
            train_loss=train_loss,
        )

    @property
    def nbytes(self) -> int:
        """Tensor payload bytes: what the wire carries, less its ~0.1 % framing."""
        return sum(t.numel() * t.element_size() for t in self.tensors.values())


@dataclass
class EvalReport:
    """Correct/total counts per seen task on one client's test share."""

    run_id: str
    client_id: str
    client_index: int
    task: int  # the task just finished
    correct: list[int]  # correct[j] for tasks j = 0..task
    total: list[int]


# ----------------------------------------------------------------------- the step protocol
#
# What the coordinator answers a Pull with when no step is ready, and what the transport and
# servicer exchange around a Pull and a Push (proto/codec.py turns them into protobuf).


@dataclass(frozen=True)
class Wait:
    """The coordinator has no step ready for this client: pull again after ``retry_after_s``."""

    retry_after_s: float
    reason: str = ""


@dataclass(frozen=True)
class PullQuery:
    """A client asking for its next step; it last completed ``(task, round, phase)``."""

    run_id: str
    client_id: str
    last_completed: tuple[int, int, Phase] | None = None  # None: nothing completed yet


@dataclass(frozen=True)
class PushEnvelope:
    """A push's first message, decoded and checked before any tensor byte is read."""

    run_id: str
    client_id: str
    client_index: int
    task: int
    round: int
    phase: Phase
    idempotency_key: str  # a retried push reuses its key: the coordinator records it once
    num_samples: int
    train_loss: float
    total_bytes: int  # tensor bytes the push declares
    declared: dict[str, tuple[str, tuple[int, ...]]] = dataclasses.field(default_factory=dict)  # name -> (dtype, shape)
    secure_attempt: int = 0  # a masked push: the step's secure session its masks were made for
