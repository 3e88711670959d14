"""Typed settings: each method (and the dataset loaders) declares its own, with defaults and help.

A section is a frozen dataclass whose fields are the settings: a type annotation (``int``,
``float``, ``bool``, ``str``, ``tuple[float, ...]`` or ``list[str]``), a default and a help
text (:func:`setting`); ``__post_init__`` checks what one field cannot say alone. A run keeps
the values it sets in ``RunConfig.settings`` (``section -> key -> value``, JSON) and reads them
typed with ``RunConfig.section(cls)``; ``--set ridge.rp_dim=5000`` changes one key.

Sections: ``data`` (:class:`DataSettings`), ``model`` (:class:`ModelSettings`), ``robust``
(:class:`RobustSettings`), ``secagg`` (:class:`SecAggSettings`) and those the method registry
(``common.methods``)
names for its methods: ``ridge``, ``ncm``, ``ties`` (``common.methods.sections()``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

T = TypeVar("T", bound="Settings")


def setting(default: Any, help: str) -> Any:
    """A settings field with its default and help text (lists and tuples are copied per instance)."""
    if isinstance(default, list):
        return field(default_factory=lambda: list(default), metadata={"help": help})
    return field(default=default, metadata={"help": help})


@dataclass(frozen=True)
class Settings:
    """A section of typed settings; subclasses name it with ``section``."""

    section: ClassVar[str] = ""

    @classmethod
    def parse(cls: type[T], values: dict[str, Any]) -> T:
        """The section from JSON values; ``ValueError`` naming the key and the expected type or range."""
        if not isinstance(values, dict):
            raise ValueError(f"settings section {cls.section!r} expects an object of settings, got {values!r}")
        hints = typing.get_type_hints(cls)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown setting {cls.section}.{unknown[0]}; {cls.section} has {sorted(known)}")
        return cls(**{key: _coerce(f"{cls.section}.{key}", hints[key], value) for key, value in values.items()})

    @classmethod
    def describe(cls) -> list[str]:
        """One line per setting: ``section.key (type, default value): help``."""
        hints = typing.get_type_hints(cls)
        defaults = cls()
        return [
            f"{cls.section}.{f.name} ({_type_name(hints[f.name])}, default {getattr(defaults, f.name)!r}): "
            f"{f.metadata.get('help', '')}"
            for f in dataclasses.fields(cls)
        ]


def _type_name(kind: Any) -> str:
    return str(getattr(kind, "__name__", kind)) if typing.get_origin(kind) is None else str(kind).replace("typing.", "")


def _coerce(key: str, kind: Any, value: Any) -> Any:
    """``value`` as ``kind`` when it is one (an int is a float too); else ``ValueError`` naming ``key``."""
    origin, args = typing.get_origin(kind), typing.get_args(kind)
    if origin in (list, tuple) and isinstance(value, (list, tuple)):
        item = args[0]
        return origin(_coerce(f"{key}[{i}]", item, v) for i, v in enumerate(value))
    if kind is float and isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    if kind in (int, str, bool) and type(value) is kind:
        return value
    raise ValueError(f"setting {key} expects {_type_name(kind)}, got {type(value).__name__} {value!r}")


def finite_number(key: str, value: float, low: float, strict: bool = False) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is finite and ``>= low`` (``> low`` when ``strict``)."""
    if not (math.isfinite(value) and (value > low if strict else value >= low)):
        raise ValueError(f"setting {key} must be a finite number {'>' if strict else '>='} {low:g}, got {value}")


def _at_least_one(section: Settings, *keys: str) -> None:
    """``ValueError`` naming the first of ``keys`` (integer settings of ``section``) that is below 1."""
    for key in keys:
        if getattr(section, key) < 1:
            raise ValueError(f"setting {section.section}.{key} must be a positive integer, got {getattr(section, key)}")


def _positive_int(key: str, value: int, zero: str) -> None:
    if value < 0:
        raise ValueError(f"setting {key} must be a non-negative integer ({zero}), got {value}")


# ----------------------------------------------------------------------------- the sections


@dataclass(frozen=True)
class DataSettings(Settings):
    """What the dataset loaders (``client/datasets.py``) read besides ``RunConfig``'s data fields."""

    section: ClassVar[str] = "data"
    train_file: str = setting("", "textfile: training samples, .csv (text,label) or .jsonl; relative to data_dir")
    test_file: str = setting("", "textfile: test samples, as train_file")
    root: str = setting("", "imagefolder: folder with train/<class>/* and test/<class>/*; relative to data_dir")
    classes: list[str] = setting(
        [], "textfile, imagefolder: the class order ([]: the files' own); with num_tasks or task_sizes, the run's tasks"
    )
    owned: bool = setting(
        False,
        "the clients train on their own data (lorm-client --data), labelled by the names of data.classes, "
        "instead of Dirichlet shards of one dataset; a client may hold none of a task's classes",
    )
    clients_dir: str = setting(
        "", "lorm-sim, lorm-launch: each client's own data, DIR/client<i>.csv or DIR/client<i>/ (lorm-client --data)"
    )
    label_column: str = setting("", "textfile: the label's column or key ('': the first of label, intent, category)")
    transforms: str = setting("imagefolder", "imagefolder: whose image transforms to use (a dataset name)")
    image_size: int = setting(0, "images: input side in pixels (0: the backbone's, 224 for ViT-B/16, 16 for tiny-vit)")
    synthetic_classes: int = setting(12, "synthetic-text: number of classes")
    synthetic_train: int = setting(60, "synthetic-text: training samples per class")
    synthetic_test: int = setting(20, "synthetic-text: test samples per class")
    validation: int = setting(
        0,
        "k > 0: tune without the test set: every k-th training sample of each class is evaluated instead "
        "of the test split (which is not used), the others train; 0: the dataset's test split",
    )
    train_val: bool = setting(
        False,
        "clinc150: its val split (20 utterances per intent) trains too, after the train split: it is "
        "training data, never test; false: the train split alone (the paper's protocol)",
    )

    def __post_init__(self) -> None:
        _positive_int("data.image_size", self.image_size, "0: the backbone's")
        _positive_int("data.validation", self.validation, "0: the test split")
        if self.validation == 1:
            raise ValueError("setting data.validation=1 would hold out every training sample; use k >= 2 (or 0)")
        for key in ("synthetic_classes", "synthetic_train", "synthetic_test"):
            if getattr(self, key) < 1:
                raise ValueError(f"setting data.{key} must be a positive integer, got {getattr(self, key)}")


@dataclass(frozen=True)
class ModelSettings(Settings):
    """What the backbones (``client/backbones.py``) read besides ``RunConfig``'s model fields."""

    section: ClassVar[str] = "model"
    weights: str = setting("", "timm ViTs: a local model.safetensors instead of the Hugging Face hub or cache")


ROBUST_ACTIONS = ("clip", "refuse")


@dataclass(frozen=True)
class RobustSettings(Settings):
    """The coordinator's guard against poisoned updates (``server/robust.py``): off unless enabled."""

    section: ClassVar[str] = "robust"
    enabled: bool = setting(False, "screen every step's updates before any is folded (folding waits for the step)")
    kappa: float = setting(
        2.0, "bound: a client's per-sample Gram trace, class-sum norm or change norm at most kappa x the step's median"
    )
    action: str = setting("clip", "over the bound: 'clip' scales the tensor down to it, 'refuse' drops the update")
    min_cosine: float = setting(
        -0.2, "drop an update whose change points away from the other clients' sum (cosine below this)"
    )
    relative_cosine: float = setting(
        0.5, "drop an update whose cosine is below this fraction of the step's median client's (when that is > 0)"
    )
    min_clients: int = setting(3, "screen only steps with at least this many updates (a median needs a few)")

    def __post_init__(self) -> None:
        finite_number("robust.kappa", self.kappa, 1.0)
        if self.action not in ROBUST_ACTIONS:
            raise ValueError(f"setting robust.action must be one of {list(ROBUST_ACTIONS)}, got {self.action!r}")
        if not -1.0 <= self.min_cosine <= 1.0:
            raise ValueError(f"setting robust.min_cosine must lie in [-1, 1], got {self.min_cosine}")
        if not 0.0 <= self.relative_cosine < 1.0:
            raise ValueError(f"setting robust.relative_cosine must lie in [0, 1), got {self.relative_cosine}")
        if self.min_clients < 3:
            raise ValueError(f"setting robust.min_clients must be at least 3, got {self.min_clients}")


SECAGG_MODES = ("honest", "signed")


@dataclass(frozen=True)
class SecAggSettings(Settings):
    """Secure aggregation (``common/secagg*.py``, ``server/secure.py``): the coordinator learns only sums."""

    section: ClassVar[str] = "secagg"
    enabled: bool = setting(False, "clients send their merge terms masked; the coordinator unmasks only their sum")
    threshold: int = setting(0, "clients that finishing a step for its sum to be unmasked (0: a majority, n // 2 + 1)")
    bound: float = setting(2.0**40, "largest magnitude of a term a client may send (fixed point; larger is refused)")
    frac_bits: int = setting(0, "fractional bits of the fixed point (0: the most n x bound leaves under 2^126, <= 64)")
    unsafe_low_threshold: bool = setting(
        False,
        "allow a threshold of n / 2 or less: then fewer than half of the clients' shares unmask an input "
        "(for tests of the protocol, never a run that protects anyone)",
    )
    max_attempts: int = setting(
        3, "sessions a step may fail (wrong shares, a sum out of range) before it ends unmerged"
    )
    mode: str = setting(
        "honest",
        "'honest': against a curious coordinator that follows the protocol; 'signed': against one that deviates "
        "(keys and the unmask request signed with each client's certificate; threshold at least 2n/3 + 1)",
    )

    def __post_init__(self) -> None:
        _positive_int("secagg.threshold", self.threshold, "0: a majority")
        finite_number("secagg.bound", self.bound, 0.0, strict=True)
        if not 0 <= self.frac_bits <= 96:
            raise ValueError(f"setting secagg.frac_bits must lie in [0, 96] (0: chosen), got {self.frac_bits}")
        if self.max_attempts < 1:
            raise ValueError(f"setting secagg.max_attempts must be at least 1, got {self.max_attempts}")
        if self.mode not in SECAGG_MODES:
            raise ValueError(f"setting secagg.mode must be one of {', '.join(SECAGG_MODES)}, got {self.mode!r}")

    def check_clients(self, clients: int) -> None:
        """``ValueError`` unless the threshold suits a run of ``clients``: at most ``clients``, and above
        ``clients / 2`` (a minority of colluding shares would unmask a client's input) unless
        ``unsafe_low_threshold`` says otherwise."""
        if not self.threshold:
            return  # 0: a majority, n // 2 + 1
        if self.threshold > clients:
            raise ValueError(
                f"setting secagg.threshold={self.threshold} exceeds num_clients={clients}: no sum could be unmasked"
            )
        if 2 * self.threshold <= clients and not self.unsafe_low_threshold:
            raise ValueError(
                f"setting secagg.threshold={self.threshold} is at most half of num_clients={clients}: "
                f"{self.threshold} colluding shares would unmask one client's input; use more than {clients // 2} "
                "(0: a majority), or secagg.unsafe_low_threshold=true for a test of the protocol"
            )


POOLS = ("mean", "first")
LAMBDA_RULES = ("auto", "members", "average")
NORMS = ("none", "layer")
ACTIVATIONS = ("relu", "gelu", "tanh", "none")


@dataclass(frozen=True)
class NcmSettings(Settings):
    """Cosine nearest class mean (``ncm``, ``lorm-ncm``): the feature map of the closed-form head."""

    section: ClassVar[str] = "ncm"
    rp_dim: int = setting(0, "width F' of the random projection + activation before the head (0: none, F' = F)")
    activation: str = setting(
        "relu",
        "with rp_dim: the function of each projected feature, 'relu' max(0, z) (the arc-cosine kernel's random "
        "features), 'gelu', 'tanh', or 'none' (a linear projection); the projection is unscaled N(0, 1), so z has "
        "a deviation of |x| (about 34 for three layer-normed MiniLM layers): there gelu acts as relu, tanh as sign",
    )
    layers: tuple[int, ...] = setting(
        (),
        "hidden states pooled and concatenated as the head's features, indexed as the backbone's hidden "
        "states (0: the embeddings, 1..L: the blocks, -1: the last); empty: the backbone's own features",
    )
    pool: str = setting(
        "mean", "with layers: pool each hidden state by its 'mean' over the tokens kept, or 'first' token"
    )
    norm: str = setting(
        "none",
        "with layers: 'layer' scales each pooled vector to mean 0 and deviation 1 over its dimensions "
        "(per sample: no statistics, exact under any split); 'none' leaves them",
    )

    def __post_init__(self) -> None:
        _positive_int(f"{self.section}.rp_dim", self.rp_dim, "0: no projection")
        if self.pool not in POOLS:
            raise ValueError(f"setting {self.section}.pool must be one of {list(POOLS)}, got {self.pool!r}")
        if self.norm not in NORMS:
            raise ValueError(f"setting {self.section}.norm must be one of {list(NORMS)}, got {self.norm!r}")
        if self.activation not in ACTIVATIONS:
            raise ValueError(
                f"setting {self.section}.activation must be one of {list(ACTIVATIONS)}, got {self.activation!r}"
            )
        if self.activation != "relu" and not self.rp_dim:
            raise ValueError(
                f"setting {self.section}.activation applies to the random projection: "
                f"it needs {self.section}.rp_dim > 0"
            )
        if len(set(self.layers)) != len(self.layers):
            raise ValueError(f"setting {self.section}.layers names a layer twice: {list(self.layers)}")
        if not self.layers and (self.pool, self.norm) != ("mean", "none"):
            raise ValueError(
                f"settings {self.section}.pool and {self.section}.norm apply to the pooled hidden states of "
                f"{self.section}.layers, which is empty (the backbone's own features)"
            )

    def feature_width(self, hidden: int) -> int:
        """``F``: the head's features before the projection, for hidden states of width ``hidden``."""
        return hidden * len(self.layers) if self.layers else hidden

    def head_width(self, hidden: int) -> int:
        """``F'``: the head's input width."""
        return self.rp_dim or self.feature_width(hidden)


DEFAULT_LAMBDAS = tuple(10.0**k for k in range(-2, 8))  # a decade grid; one Cholesky each (F'=10,000: ~15 s)


@dataclass(frozen=True)
class RidgeSettings(NcmSettings):
    """Ridge regression heads (``ridge``, ``lorm-ridge``, ``lorm-ridge-first``)."""

    section: ClassVar[str] = "ridge"
    fixed_lambda: float = setting(0.0, "the ridge lambda (0: choose it from `lambdas` on held-out samples)")
    lambdas: tuple[float, ...] = setting(DEFAULT_LAMBDAS, "the lambdas to choose from (held-out squared error)")
    holdout: int = setting(
        5,
        "hold out training samples with global index i % holdout == 0 to choose lambda "
        "(0: none; then fixed_lambda is needed)",
    )
    blocks: int = setting(
        1,
        "K: an ensemble of K ridge heads, each on its own rp_dim-wide random projection, outputs averaged; "
        "clients send and the coordinator keeps only the K diagonal rp_dim x rp_dim blocks of the Gram "
        "(needs rp_dim; lambda is shared, chosen by lambda_rule)",
    )
    lambda_rule: str = setting(
        "auto",
        "with blocks > 1, the held-out error that chooses lambda: 'average' (the ensemble's own, averaged "
        "scores: clients send the held-out samples' whole-width Gram factor, the same bytes when a client holds "
        "out at most rp_dim samples; not with secure aggregation), 'members' (the K members' errors summed, from "
        "the held-out Gram's diagonal blocks), or 'auto' (average, members with secure aggregation); with "
        "blocks = 1 all are the same",
    )

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.blocks < 1:
            raise ValueError(f"setting ridge.blocks must be a positive integer (1: one head), got {self.blocks}")
        if self.lambda_rule not in LAMBDA_RULES:
            raise ValueError(f"setting ridge.lambda_rule must be one of {list(LAMBDA_RULES)}, got {self.lambda_rule!r}")
        if self.blocks > 1 and not self.rp_dim:
            raise ValueError(
                f"setting ridge.blocks = {self.blocks} needs ridge.rp_dim > 0: each member of the ensemble is a "
                "ridge head on its own random projection"
            )
        if self.fixed_lambda < 0 or not math.isfinite(self.fixed_lambda):
            raise ValueError(
                f"setting ridge.fixed_lambda must be a positive number (0: choose it), got {self.fixed_lambda}"
            )
        if self.holdout < 0 or self.holdout == 1:
            raise ValueError(f"setting ridge.holdout must be 0 (none) or >= 2, got {self.holdout}")
        if not self.fixed_lambda and (self.holdout < 2 or not self.lambdas or min(self.lambdas) <= 0):
            raise ValueError(
                "ridge chooses lambda on held-out training samples: it needs ridge.holdout >= 2 "
                f"(got {self.holdout}) and positive ridge.lambdas (got {list(self.lambdas)}), "
                "or a fixed ridge.fixed_lambda > 0"
            )

    def head_width(self, hidden: int) -> int:
        """``K F'``: the K members' projections side by side."""
        return self.rp_dim * self.blocks if self.rp_dim else self.feature_width(hidden)

    def average_rule(self, secure: bool) -> bool:
        """Lambda by the ensemble's own held-out error: ``blocks > 1`` and ``lambda_rule`` 'average', or 'auto'
        without secure aggregation (``secure``), which can add up only the members' Gram blocks."""
        return self.blocks > 1 and (self.lambda_rule == "average" or (self.lambda_rule == "auto" and not secure))


@dataclass(frozen=True)
class TiesSettings(Settings):
    """TIES merging (``ties``)."""

    section: ClassVar[str] = "ties"
    density: float = setting(0.3, "k: the fraction of entries of largest magnitude each client keeps, in (0, 1]")
    scale: float = setting(0.4, "lambda: the merged task vector's step size")

    def __post_init__(self) -> None:
        if not 0.0 < self.density <= 1.0:
            raise ValueError(f"setting ties.density should lie in (0, 1], got {self.density}")
        if not math.isfinite(self.scale):
            raise ValueError(f"setting ties.scale should be finite, got {self.scale}")


@dataclass(frozen=True)
class EwcSettings(Settings):
    """Elastic weight consolidation (``ewc``), federated: FedAvg of the weights, the penalty on clients."""

    section: ClassVar[str] = "ewc"
    strength: float = setting(
        2.0, "lambda of the penalty lambda/2 sum_k F_k (theta_k - theta*_k)^2 (2: the paper's code's ewc_lambda 1)"
    )
    decay: float = setting(
        0.9, "F <- decay F + F_task at each task's end (the paper's code's ewc_gamma; 1: a plain sum)"
    )

    def __post_init__(self) -> None:
        finite_number("ewc.strength", self.strength, 0.0)
        if not 0.0 <= self.decay <= 1.0:
            raise ValueError(f"setting ewc.decay must lie in [0, 1], got {self.decay}")


@dataclass(frozen=True)
class LwfSettings(Settings):
    """Learning without forgetting (``lwf``), federated: FedAvg of the weights, distillation on clients."""

    section: ClassVar[str] = "lwf"
    alpha: float = setting(0.5, "weight of the distillation loss (the paper's code's alpha)")
    temperature: float = setting(2.0, "softmax temperature of teacher and student on the old classes")

    def __post_init__(self) -> None:
        finite_number("lwf.alpha", self.alpha, 0.0)
        finite_number("lwf.temperature", self.temperature, 0.0, strict=True)


@dataclass(frozen=True)
class L2pSettings(Settings):
    """Learning to prompt (``l2p``), federated: FedAvg of the prompt pool, its keys and the head."""

    section: ClassVar[str] = "l2p"
    pool: int = setting(10, "prompts in the pool (the paper's code: 10)")
    length: int = setting(5, "tokens per prompt (the paper's code: 5)")
    top_k: int = setting(5, "prompts chosen per sample by query-key matching, prepended together (5)")
    pull: float = setting(
        0.1, "weight of the surrogate matching loss sum_i (1 - cos(q, k_si)) (L2P's 0.1; the paper's code: none)"
    )
    init: float = setting(
        1.0, "prompts and keys start U(-init, init) (L2P's: 1; a prompt token's norm is then sqrt(F/3) init)"
    )
    features: str = setting(
        "prompts",
        "the head's input: 'prompts', the mean of the prompt positions' states (L2P's), or 'pooled', "
        "the backbone's own pooling of the prompted sequence",
    )

    def __post_init__(self) -> None:
        if self.features not in ("prompts", "pooled"):
            raise ValueError(f"setting l2p.features must be 'prompts' or 'pooled', got {self.features!r}")
        _at_least_one(self, "pool", "length", "top_k")
        if self.top_k > self.pool:
            raise ValueError(f"setting l2p.top_k ({self.top_k}) must not exceed l2p.pool ({self.pool})")
        finite_number("l2p.pull", self.pull, 0.0)
        finite_number("l2p.init", self.init, 0.0, strict=True)


@dataclass(frozen=True)
class CodaSettings(Settings):
    """CODA-Prompt (``coda-p``), federated: FedAvg of the current task's prompt components and the head."""

    section: ClassVar[str] = "coda"
    components: int = setting(100, "prompt components of all tasks, components // tasks per task (100)")
    length: int = setting(8, "tokens per prompt (8)")
    ortho: float = setting(0.0, "weight of the orthogonality penalty on components, keys, attention (0: CODA-P's)")

    def __post_init__(self) -> None:
        _at_least_one(self, "components", "length")
        finite_number("coda.ortho", self.ortho, 0.0)


@dataclass(frozen=True)
class CcvrSettings(Settings):
    """Classifier calibration with virtual representations (``ccvr``): FedAvg, then the head re-trained
    at each task's end on features drawn from the merged per-class Gaussians."""

    section: ClassVar[str] = "ccvr"
    covariance: str = setting("full", "'full' per-class covariances (CCVR's), or 'diag' (the paper's code)")
    samples: int = setting(256, "virtual features per class and epoch (the paper's code: 256)")
    epochs: int = setting(5, "epochs of head training on virtual features (5)")
    lr: float = setting(0.01, "SGD learning rate of that training, cosine-annealed over the epochs (0.01)")
    momentum: float = setting(0.9, "SGD momentum (0.9)")
    logit_norm: float = setting(
        0.1, "temperature of the logits divided by their norm (the paper's code: 0.1); 0: plain cross-entropy"
    )

    def __post_init__(self) -> None:
        if self.covariance not in ("full", "diag"):
            raise ValueError(f"setting ccvr.covariance must be 'full' or 'diag', got {self.covariance!r}")
        _at_least_one(self, "samples", "epochs")
        finite_number("ccvr.lr", self.lr, 0.0, strict=True)
        finite_number("ccvr.momentum", self.momentum, 0.0)
        finite_number("ccvr.logit_norm", self.logit_norm, 0.0)


@dataclass(frozen=True)
class VeraSettings(Settings):
    """LoRM with VeRA modules (``lorm-vera``): frozen seeded random ``B, A`` per layer, trained vectors
    ``lb`` and ``ld`` merged in closed form (``../shared/SPEC.md`` §5)."""

    section: ClassVar[str] = "vera"
    rank: int = setting(64, "r: the width of the frozen random B (d_out, r) and A (r, d_in); ld has r entries")
    d_init: float = setting(0.1, "the value of every entry of ld at a task's start (lb starts at 0), as VeRA")
    form: str = setting(
        "exact",
        "exact: the least-squares merges of SPEC §5; appendix: the paper's appendix formulas "
        "(RegMean of the dense deltas, divided element-wise by the frozen matrix, row means)",
    )

    def __post_init__(self) -> None:
        _at_least_one(self, "rank")
        finite_number("vera.d_init", self.d_init, 0.0)
        if self.form not in ("exact", "appendix"):
            raise ValueError(f"setting vera.form should be 'exact' or 'appendix', got {self.form!r}")


@dataclass(frozen=True)
class Ia3Settings(Settings):
    """LoRM with (IA)^3 modules (``lorm-ia3``): a trained vector rescales each target layer's output or input,
    merged in closed form (``../shared/SPEC.md`` §5)."""

    section: ClassVar[str] = "ia3"
    side: str = setting("output", "output: l o (W0 x), the paper's appendix; input: W0 (l o x)")
    form: str = setting(
        "exact",
        "exact: the least-squares merges of SPEC §5; appendix: the paper's appendix formula (output side, "
        "diagonal Grams: RegMean of the dense deltas, divided element-wise by W0, row means)",
    )

    def __post_init__(self) -> None:
        if self.side not in ("output", "input"):
            raise ValueError(f"setting ia3.side should be 'output' or 'input', got {self.side!r}")
        if self.form not in ("exact", "appendix"):
            raise ValueError(f"setting ia3.form should be 'exact' or 'appendix', got {self.form!r}")
        if self.form == "appendix" and self.side == "input":
            raise ValueError("setting ia3.form=appendix: the paper's appendix gives a formula for the output side only")


@dataclass(frozen=True)
class TargetSettings(Settings):
    """TARGET (``target``): FedAvg, with distillation on synthetic inputs of the old classes drawn data-free
    from the previous task's model (defaults: the paper's code's)."""

    section: ClassVar[str] = "target"
    kd_alpha: float = setting(25.0, "lambda_KL: weight of the clients' distillation on synthetic inputs (25)")
    kd_temperature: float = setting(2.0, "temperature of that distillation (2)")
    rounds: int = setting(30, "g_ep: synthesis rounds, each adding one batch of synthetic inputs (30)")
    steps: int = setting(80, "generator steps per synthesis round (80)")
    batch: int = setting(16, "synthetic inputs per synthesis round, and per training batch's distillation (16)")
    warmup: int = setting(20, "synthesis rounds before the adversarial term and the student's training (20)")
    lr_generator: float = setting(
        0.002, "Adam learning rate of the generator (0.002; its meta-learned copy: steps times that)"
    )
    lr_z: float = setting(0.01, "Adam learning rate of the latent codes (0.01)")
    ce: float = setting(0.5, "weight of the teacher's cross-entropy on the requested classes (oh: 0.5)")
    adv: float = setting(1.0, "weight of the adversarial term, the student's disagreement with the teacher (1)")
    student_steps: int = setting(50, "the student's distillation steps per synthesis round after the warm-up (50)")
    student_temperature: float = setting(20.0, "temperature of the student's distillation (20)")
    student_lr: float = setting(
        0.002,
        "SGD learning rate of the student's distillation, momentum 0.9, weight decay 1e-4, constant (0.002, "
        "the paper's code's; TARGET's own code: 0.2, cosine-annealed)",
    )
    tokens: int = setting(16, "text: synthetic token embeddings per input (16)")
    latent: int = setting(256, "dimension of the generator's latent code (256)")

    def __post_init__(self) -> None:
        _at_least_one(self, "rounds", "steps", "batch", "tokens", "latent")
        if not 0 <= self.warmup or self.student_steps < 0:
            raise ValueError("settings target.warmup and target.student_steps must be non-negative")
        for key in ("kd_alpha", "ce", "adv"):
            finite_number(f"target.{key}", getattr(self, key), 0.0)
        for key in ("kd_temperature", "lr_generator", "lr_z", "student_temperature", "student_lr"):
            finite_number(f"target.{key}", getattr(self, key), 0.0, strict=True)


# ``RunConfig.extra`` keys of earlier versions -> (section, key); ``rp_dim`` goes to the run's closed-form section.
LEGACY_EXTRA: dict[str, tuple[str, str]] = {
    **{
        key: ("data", key)
        for key in (
            "train_file",
            "test_file",
            "root",
            "classes",
            "transforms",
            "image_size",
            "synthetic_classes",
            "synthetic_train",
            "synthetic_test",
        )
    },
    "weights": ("model", "weights"),
    "rp_dim": ("ridge", "rp_dim"),
    "ridge_lambda": ("ridge", "fixed_lambda"),
    "ridge_lambdas": ("ridge", "lambdas"),
    "ridge_holdout": ("ridge", "holdout"),
    "ties_density": ("ties", "density"),
    "ties_lambda": ("ties", "scale"),
}
