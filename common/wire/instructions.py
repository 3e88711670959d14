"""The steps' instructions: what a step asks of a client beyond the envelope's identity, step and tensors.

An instruction is a small frozen dataclass of scalars, one class per way of training (``LoraStep``, ``DenseStep``,
``PromptStep``, ``FeaturesStep``) or per method that needs more (its slice, ``common/methods/<name>.py``), with the
kind of model it trains (:class:`Mode`) and the Grams it asks for (:class:`GramKind`). It travels as its ``KIND``
and its fields as JSON inside the envelope of its sibling :mod:`common.wire.messages` (``RoundPlan.instruction``):
a method with a new instruction changes no shared message, no .proto and no codec.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from typing import Any, ClassVar

from common.typed.fields import parse_fields
from common.wire.tensors import PARTS


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


MAX_INSTRUCTION = 65_536  # characters of an instruction's fields: a few scalars, far below it


_INSTRUCTIONS: dict[str, type[Instruction]] = {}  # KIND -> class: each subclass registers itself when defined


@dataclass(frozen=True)
class Instruction:
    """No instruction: the plan of a finished run (``DONE``). Subclasses name their ``KIND`` (unique: the wire
    name) and ``MODE`` (the client half that serves it), and hold only ``bool``, ``int``, ``float``, ``str``,
    ``GramKind`` and ``tuple[str, ...]`` fields with defaults."""

    KIND: ClassVar[str] = "none"
    MODE: ClassVar[Mode | None] = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "KIND" not in cls.__dict__:
            raise TypeError(f"{cls.__name__} must name its KIND (the instruction's wire name)")
        other = _INSTRUCTIONS.get(cls.KIND)
        if other is not None and other.__qualname__ != cls.__qualname__:
            raise TypeError(f"instruction kind {cls.KIND!r} of {cls.__name__} is taken by {other.__name__}")
        _INSTRUCTIONS[cls.KIND] = cls

    def factors(self) -> str:
        """The LoRA factors the step trains, for logs and history (``"B"``, ``"A"``, ``"BA"``; ``""``: none)."""
        return ""

    def to_json(self) -> str:
        return json.dumps(
            {f.name: _json_value(getattr(self, f.name)) for f in dataclasses.fields(self)}, separators=(",", ":")
        )

    @staticmethod
    def from_wire(kind: str, text: str, slices: Callable[[], object]) -> Instruction:
        """The instruction ``kind`` with the fields of ``text`` (JSON); ``ValueError`` naming what is wrong: an
        unknown kind, a field it does not have, a value of another type, or what the class itself refuses.
        ``slices`` imports the methods' slices, whose instructions register when imported (the caller's
        ``common.methods.registry``); it is called only for a kind not registered yet."""
        if kind not in _INSTRUCTIONS and kind != Instruction.KIND:
            slices()
        cls = Instruction if kind == Instruction.KIND else _INSTRUCTIONS.get(kind)
        if cls is None:
            raise ValueError(f"unknown instruction kind {kind!r}; this client knows {sorted(_INSTRUCTIONS)}")
        if len(text) > MAX_INSTRUCTION:
            raise ValueError(f"instruction {kind!r}: {len(text)} characters of fields, over {MAX_INSTRUCTION}")
        try:
            values = json.loads(text or "{}")
        except (ValueError, RecursionError) as err:  # nested past the parser's stack: not an instruction either
            raise ValueError(f"instruction {kind!r}: not JSON ({type(err).__name__}: {err})") from err
        if not isinstance(values, dict):
            raise ValueError(f"instruction {kind!r}: expected a JSON object, got {type(values).__name__}")
        return parse_fields(cls, values, f"instruction {kind!r}", lambda name: f"instruction {kind!r} field {name!r}")


def _json_value(value: Any) -> Any:
    return value.value if isinstance(value, Enum) else list(value) if isinstance(value, tuple) else value


@dataclass(frozen=True)
class TrainInstruction(Instruction):
    """What every trained step may ask besides its own: send the head (weight and bias), the Grams of the
    adapted layers' inputs (``gram``) and the head input's full Gram (``head_gram``)."""

    KIND: ClassVar[str] = "train"
    send_head: bool = True
    gram: GramKind = GramKind.NONE
    head_gram: bool = False

    @property
    def sends_grams(self) -> bool:
        """Whether the step's update carries any Gram (of the adapted layers' inputs or of the head's)."""
        return self.gram != GramKind.NONE or self.head_gram


@dataclass(frozen=True)
class LoraStep(TrainInstruction):
    """A LoRA method's step (``Mode.LORA``): which factors train (a subset of ``("B", "A")``), the scale of the
    current factors in the Gram pass (1 when training), and whether training sees the frozen ``extra`` delta
    (``W0 + extra + s B A``; otherwise ``W0 + s B A``, the extra for Gram passes only)."""

    KIND: ClassVar[str] = "lora"
    MODE: ClassVar[Mode | None] = Mode.LORA
    train_factors: tuple[str, ...] = ()
    view_scale: float = 1.0
    train_extra: bool = False

    def factors(self) -> str:
        return "".join(self.train_factors)

    def __post_init__(self) -> None:
        factors = self.train_factors
        if set(factors) - set(PARTS) or len(set(factors)) != len(factors):
            raise ValueError(f"train_factors: expected distinct entries of {PARTS}, got {list(factors)}")


@dataclass(frozen=True)
class DenseStep(TrainInstruction):
    """A full fine-tuning step (``Mode.FULL``: every backbone weight, ``W0 + delta``); ``send_fisher``: also the
    diagonal empirical Fisher (FisherAvg's rounds, EWC's step at a task's end)."""

    KIND: ClassVar[str] = "dense"
    MODE: ClassVar[Mode | None] = Mode.FULL
    send_fisher: bool = False


@dataclass(frozen=True)
class PromptStep(TrainInstruction):
    """A prompt pool's step (``Mode.PROMPT``: L2P, CODA-Prompt): the first ``prompt_frozen`` components of every
    pool tensor are frozen (used, not trained, not sent)."""

    KIND: ClassVar[str] = "prompt"
    MODE: ClassVar[Mode | None] = Mode.PROMPT
    prompt_frozen: int = 0

    def __post_init__(self) -> None:
        if self.prompt_frozen < 0:
            raise ValueError(f"prompt_frozen: expected a non-negative count, got {self.prompt_frozen}")


@dataclass(frozen=True)
class FeaturesStep(TrainInstruction):
    """No training (``Mode.FEATURES``): statistics of the task's features (closed-form heads, CCVR); ``head_gram``
    asks for the features' Gram."""

    KIND: ClassVar[str] = "features"
    MODE: ClassVar[Mode | None] = Mode.FEATURES
    send_head: bool = False
