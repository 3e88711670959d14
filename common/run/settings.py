"""Typed settings: each method (and the dataset loaders) declares its own, with defaults and help.

A section is a frozen dataclass whose fields are the settings: a type annotation (``int``,
``float``, ``bool``, ``str``, ``tuple[float, ...]`` or ``list[str]``), a default and a help
text (:func:`setting`); values are parsed by their annotations (``common.typed.fields``, which
parses the steps' instructions too), and ``__post_init__`` checks what one field cannot say alone. A run keeps
the values it sets in ``RunConfig.settings`` (``section -> key -> value``, JSON) and reads them
typed with ``RunConfig.section(cls)``; ``--set ridge.rp_dim=5000`` changes one key.

Sections here: the run's own, ``data`` (:class:`DataSettings`), ``model`` (:class:`ModelSettings`),
``robust`` (:class:`RobustSettings`), ``secagg`` (:class:`SecAggSettings`) and ``dp`` (:class:`DpSettings`). Each
method's section lives in its slice (``common/methods/<name>.py``, e.g. ``ridge`` and ``ncm`` in
``closed_form.py``), and the registry lists them all (``common.methods.sections()``).
"""

from __future__ import annotations

import dataclasses
import math
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar, TypeVar

from common.typed.fields import parse_fields, type_name

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
        # a float's range, finiteness included, is each section's to check (finite_number in __post_init__)
        return parse_fields(cls, values, cls.section, lambda key: f"setting {cls.section}.{key}", finite=False)

    def inert(self) -> frozenset[str]:
        """The settings that have no effect beside these values of the others (none unless a section says so)."""
        return frozenset()

    @classmethod
    def describe(cls) -> list[str]:
        """One line per setting: ``section.key (type, default value): help``."""
        hints = typing.get_type_hints(cls)
        defaults = cls()
        return [
            f"{cls.section}.{f.name} ({type_name(hints[f.name])}, default {getattr(defaults, f.name)!r}): "
            f"{f.metadata.get('help', '')}"
            for f in dataclasses.fields(cls)
        ]


def finite_number(key: str, value: float, low: float, strict: bool = False) -> None:
    """``ValueError`` naming ``key`` unless ``value`` is finite and ``>= low`` (``> low`` when ``strict``)."""
    if not (math.isfinite(value) and (value > low if strict else value >= low)):
        raise ValueError(f"setting {key} must be a finite number {'>' if strict else '>='} {low:g}, got {value}")


def at_least_one(section: Settings, *keys: str) -> None:
    """``ValueError`` naming the first of ``keys`` (integer settings of ``section``) that is below 1."""
    for key in keys:
        if getattr(section, key) < 1:
            raise ValueError(f"setting {section.section}.{key} must be a positive integer, got {getattr(section, key)}")


def is_sha256_hex(text: str) -> bool:
    """Whether ``text`` is a SHA-256 digest as this project prints them: 64 lower-case hex digits."""
    return len(text) == 64 and all(c in "0123456789abcdef" for c in text)


def non_negative_int(key: str, value: int, zero: str) -> None:
    """``ValueError`` naming ``key`` unless ``value >= 0``; ``zero`` says what 0 means."""
    if value < 0:
        raise ValueError(f"setting {key} must be a non-negative integer ({zero}), got {value}")


# ----------------------------------------------------------------------------- the sections


@dataclass(frozen=True)
class DataSettings(Settings):
    """What the dataset loaders (``client/text_datasets.py``, ``client/image_datasets.py``) read besides
    ``RunConfig``'s data fields."""

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
    open: bool = setting(
        False,
        "data.owned: after its last task the run waits for the operator's next one (lorm-admin add-task) or "
        "its end (lorm-admin finish) instead of ending",
    )
    max_classes: int = setting(
        0,
        "data.owned: the head's rows, fixed when the clients build the model: the most classes the schedule "
        "may hold, tasks the operator appends included (0: the classes of data.classes)",
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
        non_negative_int("data.image_size", self.image_size, "0: the backbone's")
        non_negative_int("data.validation", self.validation, "0: the test split")
        non_negative_int("data.max_classes", self.max_classes, "0: the classes of data.classes")
        if self.validation == 1:
            raise ValueError("setting data.validation=1 would hold out every training sample; use k >= 2 (or 0)")
        for key in ("synthetic_classes", "synthetic_train", "synthetic_test"):
            if getattr(self, key) < 1:
                raise ValueError(f"setting data.{key} must be a positive integer, got {getattr(self, key)}")


@dataclass(frozen=True)
class ModelSettings(Settings):
    """What the backbones (``client/backbone_builders.py``) read besides ``RunConfig``'s model fields."""

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
SECAGG_GRAPHS = ("auto", "complete", "sparse")


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
    graph: str = setting(
        "auto",
        "whom each client shares with and masks against: 'complete' (every other client), 'sparse' (a random "
        "k-regular graph of neighbours, k derived from n, secagg.dropout and secagg.corrupt), 'auto' (sparse from "
        "300 clients)",
    )
    dropout: float = setting(0.1, "sparse graph: the share of clients that may vanish during a step it is sized for")
    corrupt: float = setting(0.05, "sparse graph: the share of clients colluding with the coordinator it is sized for")
    failure_bits: int = setting(
        40, "sparse graph: its neighbourhoods fail the dropout or corruption bound with probability <= 2^-bits"
    )

    def __post_init__(self) -> None:
        non_negative_int("secagg.threshold", self.threshold, "0: a majority")
        finite_number("secagg.bound", self.bound, 0.0, strict=True)
        if not 0 <= self.frac_bits <= 96:
            raise ValueError(f"setting secagg.frac_bits must lie in [0, 96] (0: chosen), got {self.frac_bits}")
        if self.max_attempts < 1:
            raise ValueError(f"setting secagg.max_attempts must be at least 1, got {self.max_attempts}")
        if self.mode not in SECAGG_MODES:
            raise ValueError(f"setting secagg.mode must be one of {', '.join(SECAGG_MODES)}, got {self.mode!r}")
        if self.graph not in SECAGG_GRAPHS:
            raise ValueError(f"setting secagg.graph must be one of {', '.join(SECAGG_GRAPHS)}, got {self.graph!r}")
        for key, value in (("dropout", self.dropout), ("corrupt", self.corrupt)):
            finite_number(f"secagg.{key}", value, 0.0)
            if value >= 0.5:
                raise ValueError(f"setting secagg.{key} must lie in [0, 0.5), got {value}")
        if not 20 <= self.failure_bits <= 128:
            raise ValueError(f"setting secagg.failure_bits must lie in [20, 128], got {self.failure_bits}")

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


DP_MODES = ("central", "distributed", "local", "client")
DP_SAMPLERS = ("box-muller", "opendp")


@dataclass(frozen=True)
class DpSettings(Settings):
    """Record-level differential privacy: of the closed-form heads (``ncm``, ``ridge``), central (the coordinator
    adds the noise to the clients' summed statistics) or distributed (each client adds its share of it under secure
    aggregation); of the trained methods (LoRM's family, FedAvg-LoRA, FedAvg), local (each client trains with DP-SGD
    and noises the Grams it sends) (``docs/PRIVACY.md``)."""

    section: ClassVar[str] = "dp"
    epsilon: float = setting(
        0.0,
        "the privacy budget epsilon of every training record over the whole run (0 or inf: no differential "
        "privacy, the run as without this section)",
    )
    delta: float = setting(1e-5, "the budget's delta, in (0, 1); below 1 / (training records) to mean anything")
    clip: float = setting(
        1.0,
        "C: each sample's head features (after layers, norm and the random projection) scaled down to L2 norm at "
        "most C before they enter a sum, so a record moves the Gram by at most C^2 and the class sums by C; trained "
        "methods: each sample's gradient of the trained parameters clipped to L2 norm C (DP-SGD); dp.mode client: "
        "each client's change of a round, all its tensors together, scaled down to L2 norm C",
    )
    sample_rate: float = setting(
        0.05,
        "trained methods: q, the probability of each record to be in a DP-SGD step's batch (Poisson sampling); a "
        "round is ceil(local_epochs / q) steps, and a client of n records draws q n a step on average",
    )
    gram_clip: float = setting(
        1.0,
        "trained methods that send Grams (LoRM): each sample's rows of each recorded layer's input scaled down to "
        "energy sum_t |x_t|^2 <= gram_clip, so one record moves each Gram by at most gram_clip (Frobenius)",
    )
    gram_share: float = setting(
        0.1,
        "the Grams' share of the budget, in (0, 1), as a share of mu^2: ridge's Gram (the class sums get the rest), "
        "LoRM's Gram releases (DP-SGD gets the rest)",
    )
    lambda_scale: float = setting(
        2.0,
        "ridge without fixed_lambda: lambda = lambda_scale x sqrt(2) sigma sqrt(d), the spectral norm of the "
        "summed Gram's noise on a block of width d (AdaSSP's rule without its private least eigenvalue: it reads "
        "no data; it replaces ridge.holdout and ridge.lambda_rule); LoRM: each full Gram a client sends gets "
        "lambda_scale x its noise's spectral norm on its diagonal",
    )
    mode: str = setting(
        "central",
        "'central': the coordinator adds the Gaussian noise to the summed statistics (it sees them un-noised); "
        "'distributed': each client adds its discrete Gaussian share (an exact sampler) before masking, so that the "
        "securely aggregated sum carries the noise and the coordinator never sees a less-noisy term (needs "
        "secagg.enabled); 'local': each client noises everything it sends itself (DP-SGD, its Grams): the trained "
        "methods' mode, nobody trusted; 'client': client-level DP (DP-FedAvg) of fedavg-lora and fedavg, the "
        "coordinator clips each client's change to dp.clip, averages with equal weights and noises the mean (it sees "
        "each update: no secure aggregation)",
    )
    colluders: int = setting(
        0,
        "distributed: k, the clients that may collude with the coordinator (they know their own shares and can "
        "subtract them); each share is then V / (t - k), t the secagg threshold, so that any t survivors' honest "
        "shares still carry V; below the threshold",
    )
    seed: int = setting(
        -1,
        "the noise's generator: -1 the operating system's CSPRNG (os.urandom; distributed: a fresh ChaCha20 key per "
        "share); >= 0 a seeded torch generator (distributed: a key per seed, step, client and statistic), "
        "reproducible, for tests and benchmarks only (whoever knows the seed can subtract the noise)",
    )
    sampler: str = setting(
        "box-muller",
        "central mode's Gaussian noise: 'box-muller' (the CSPRNG's uniforms through Box-Muller, or the seeded "
        "generator), or 'opendp' (OpenDP's Gaussian mechanism on each released value: exact sampling, then "
        "rounding, without the low-bit pattern of a float Box-Muller draw; about 50 us a value, needs dp.seed -1)",
    )

    def __post_init__(self) -> None:
        if not (self.epsilon >= 0 and not math.isnan(self.epsilon)):
            raise ValueError(f"setting dp.epsilon must be > 0, or 0 or inf for none, got {self.epsilon}")
        if not 0 < self.delta < 1:
            raise ValueError(f"setting dp.delta must lie in (0, 1), got {self.delta}")
        finite_number("dp.clip", self.clip, 0.0, strict=True)
        finite_number("dp.lambda_scale", self.lambda_scale, 0.0, strict=True)
        finite_number("dp.gram_clip", self.gram_clip, 0.0, strict=True)
        if not 0 < self.sample_rate <= 1:
            raise ValueError(f"setting dp.sample_rate must lie in (0, 1], got {self.sample_rate}")
        if not 0 < self.gram_share < 1:
            raise ValueError(f"setting dp.gram_share must lie in (0, 1), got {self.gram_share}")
        non_negative_int("dp.colluders", self.colluders, "0: no client colludes with the coordinator")
        if self.seed < -1:
            raise ValueError(f"setting dp.seed must be -1 (the CSPRNG) or a seed >= 0, got {self.seed}")
        if self.mode not in DP_MODES:
            raise ValueError(f"setting dp.mode must be one of {', '.join(DP_MODES)}, got {self.mode!r}")
        if self.sampler not in DP_SAMPLERS:
            raise ValueError(f"setting dp.sampler must be one of {', '.join(DP_SAMPLERS)}, got {self.sampler!r}")
        if self.sampler == "opendp" and (self.mode != "central" or self.seed != -1):
            raise ValueError(
                "setting dp.sampler = opendp serves dp.mode central with dp.seed -1 (OpenDP draws from the operating "
                "system's randomness, unseeded): local and client-level noise cover every parameter of every step "
                "(at about 50 us a value, hours a round), and distributed shares come from the exact discrete sampler; "
                f"got dp.mode {self.mode}, dp.seed {self.seed}"
            )

    @property
    def enabled(self) -> bool:
        """A finite positive epsilon: the statistics are clipped and noised."""
        return 0 < self.epsilon < math.inf

    @property
    def distributed(self) -> bool:
        """The clients add the noise, in shares, under secure aggregation (``common/secagg/distributed_dp.py``)."""
        return self.enabled and self.mode == "distributed"

    @property
    def local(self) -> bool:
        """Each client noises what it trains and sends itself (``common/privacy/training.py``)."""
        return self.enabled and self.mode == "local"

    @property
    def client_level(self) -> bool:
        """The unit is a client's whole data: the coordinator clips and noises its change (``client_level.py``)."""
        return self.enabled and self.mode == "client"


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
