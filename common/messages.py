"""What travels between coordinator and clients, as plain dataclasses of tensors.

Only the gRPC servicer and the client transport translate these to and from protobuf; the
engine, the strategies and the client trainer see nothing but these types. The in-process
engine passes them by reference, the distributed system over the wire: same objects, same
math.

Layer names are the dotted module names of the wrapped ``nn.Linear`` layers in the backbone
(e.g. ``encoder.layer.0.attention.self.query``). Factor shapes: ``B: (d_out, r)``,
``A: (r, d_in)``; Grams ``(d_in,)`` (diagonal) or ``(d_in, d_in)`` (full).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass, field
from enum import Enum

from torch import Tensor


class Phase(str, Enum):
    """What a client is asked to do."""

    TRAIN = "train"  # local training of the listed factors + head, then (optionally) a Gram pass
    TASK_GRAM = "task_gram"  # end of task: a Gram pass only, no training
    FEATURES = "features"  # no training: statistics of the task's features (closed-form heads)
    EVALUATE = "evaluate"  # evaluate the published model on the client's test share
    DONE = "done"  # the run is over


class Mode(str, Enum):
    """What kind of model a step trains or evaluates (wire value: the string)."""

    LORA = "lora"  # LoRA factors (and the head) on W0 + s B A
    FULL = "full"  # every backbone weight: W0 + delta (the full fine-tuning baselines)
    FEATURES = "features"  # no training: statistics of the frozen features (closed-form heads)
    PROMPT = "prompt"  # a prompt pool (and the head) on the frozen W0: L2P, CODA-Prompt


class GramKind(str, Enum):
    NONE = "none"
    DIAG = "diag"
    FULL = "full"


@dataclass(frozen=True)
class ModelSpec:
    """What the coordinator must know about the model; it never builds one itself."""

    layers: dict[str, tuple[int, int]]  # LoRA layer name -> (d_out, d_in), in module order
    feature_dim: int  # the head's input width
    num_classes: int  # the head's output width (all classes of all tasks)
    export_prefix: str = ""  # prefix of layer names inside the wrapper, stripped for the exported adapter
    base_model: str = ""  # what the exported adapter applies to (hub name or local path)
    params: dict[str, tuple[int, ...]] = field(default_factory=dict)  # backbone weights (full fine-tuning)

    def to_json(self) -> str:
        return json.dumps(
            {
                "layers": {k: list(v) for k, v in self.layers.items()},
                "feature_dim": self.feature_dim,
                "num_classes": self.num_classes,
                "export_prefix": self.export_prefix,
                "base_model": self.base_model,
                "params": {k: list(v) for k, v in self.params.items()},
            }
        )

    def difference(self, other: ModelSpec) -> str:
        """The first way ``other`` differs from this spec, in words ("" when equal)."""
        for what in ("feature_dim", "num_classes", "export_prefix", "base_model"):
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
        return ""

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
        """Inverse of :meth:`to_json`; ``ValueError`` for anything that is not a model description."""
        try:
            v = json.loads(text)
            layers = {str(k): (int(s[0]), int(s[1])) for k, s in v["layers"].items()}
            params = {str(k): tuple(int(d) for d in s) for k, s in v.get("params", {}).items()}
            spec = cls(
                layers,
                int(v["feature_dim"]),
                int(v["num_classes"]),
                str(v.get("export_prefix", "")),
                str(v.get("base_model", "")),
                params,
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
        return spec


@dataclass
class LowRank:
    """A low-rank delta ``B @ A``: ``B: (d_out, k)``, ``A: (k, d_in)``."""

    b: Tensor
    a: Tensor


# The keys of a distilling method's (LwF, TARGET) ``RoundPlan.anchor`` that hold the previous task's global
# head (weight, bias): the teacher's own, fixed for the task. The plan's head moves during the task (the
# distillation trains the old classes' rows), so the teacher cannot take it. Backbone names never hold "/".
ANCHOR_HEAD = ("head/weight", "head/bias")


@dataclass
class RoundPlan:
    """Everything a client needs for one step of the run (what it pulls)."""

    run_id: str
    phase: Phase
    task: int  # 0-based task index
    round: int  # 0-based round within the task (TASK_GRAM/EVALUATE and a LoRM features step: the number of rounds)
    class_range: tuple[int, int]  # [lo, hi): the current task's classes
    seen_classes: int  # classes 0..seen_classes-1 are scored at evaluation
    train_factors: tuple[str, ...] = ()  # subset of ("B", "A") trained this round
    lora: dict[str, LowRank] = field(default_factory=dict)  # the shared current factors per layer
    lora_scale: float = 1.0  # scale of the current factors in the Gram pass (1 when training)
    extra: dict[str, LowRank] = field(default_factory=dict)  # frozen delta added to W0
    head_weight: Tensor | None = None  # (num_classes, feature_dim)
    head_bias: Tensor | None = None  # (num_classes,)
    gram: GramKind = GramKind.NONE  # Grams of the LoRA layers' inputs to send back
    head_gram: bool = False  # send the head input's full Gram
    send_head: bool = True  # send the trained head weight and bias
    seed: int = 0  # seed for this client step (combined with the client index)
    mode: Mode = Mode.LORA  # what the step trains or evaluates (see Mode)
    delta: dict[str, Tensor] = field(default_factory=dict)  # full mode: backbone weights are W0 + delta
    send_fisher: bool = False  # full mode: also send the diagonal empirical Fisher
    train_extra: bool = False  # train in the view W0 + extra + s B A (default: W0 + s B A, extra for Gram passes only)
    # full mode, continual-learning baselines: the global weights W0 + anchor at the previous task's end
    # (EWC's penalty centre, LwF's and TARGET's teacher), and EWC's accumulated diagonal Fisher there, per
    # parameter; a teacher's anchor also holds that model's head, under ANCHOR_HEAD
    anchor: dict[str, Tensor] = field(default_factory=dict)
    fisher: dict[str, Tensor] = field(default_factory=dict)
    # prompt mode: the prompt pool by name (each of shape (components, ...)); its first prompt_frozen
    # components are frozen (used, not trained, not sent), the rest are trained and sent as delta/<name>
    prompt: dict[str, Tensor] = field(default_factory=dict)
    prompt_frozen: int = 0
    # secure aggregation: which session of the step's (0; the coordinator starts a fresh one, 1, 2, ..., when
    # fewer than the threshold of a round's clients answered and enough others ask to take part)
    secure_attempt: int = 0
    # FedProto: the global prototypes, "mean" (num_classes, feature_dim) and "count" (num_classes,) (0: none yet)
    prototypes: dict[str, Tensor] = field(default_factory=dict)
    # adapter vectors per layer: VeRA's shared {"B": lb (d_out,), "A": ld (r,)} (common/vera.py); (IA)^3's
    # trained side's ("B": output, "A": input) and "E", the frozen earlier tasks' one (common/ia3.py)
    vectors: dict[str, dict[str, Tensor]] = field(default_factory=dict)


@dataclass
class ClientUpdate:
    """What a client pushes after a TRAIN, TASK_GRAM or FEATURES step."""

    run_id: str
    client_id: str
    client_index: int
    task: int
    round: int
    phase: Phase
    num_samples: int  # training samples of the current task on this client
    factors: dict[str, dict[str, Tensor]] = field(default_factory=dict)  # layer -> {"B"|"A": tensor}
    grams: dict[str, Tensor] = field(default_factory=dict)  # layer -> (d_in,) or (d_in, d_in), float64
    head_weight: Tensor | None = None
    head_bias: Tensor | None = None
    head_gram: Tensor | None = None  # (feature_dim, feature_dim), float64
    train_loss: float = float("nan")  # mean training loss over the last local epoch
    # full mode: trained minus received weights; prompt mode: the same of the trained prompt components
    delta: dict[str, Tensor] = field(default_factory=dict)
    fisher: dict[str, Tensor] = field(default_factory=dict)  # full mode: diagonal empirical Fisher
    stats: dict[str, Tensor] = field(default_factory=dict)  # features mode: feature statistics by name
    # secure aggregation: the step's running sums after this update, masked (server/secure.py), by sum name
    masked: dict[str, Tensor] = field(default_factory=dict)
    secure_attempt: int = 0  # secure aggregation: the step's session the masks were made for (RoundPlan's)


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
