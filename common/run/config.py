"""The run configuration: one dataclass, shared by coordinator, clients and the in-process engine.

It travels to clients as JSON (never pickle) so that every client derives the same tasks,
the same Dirichlet shards and the same model from it.

A :class:`RunConfig` checks its own fields when it is built; its settings sections are checked against the
methods' registry by ``common.methods.checks.validate``, which whoever builds one from user input calls. The
programs' flags that build one (``--preset``, ``--config``, ``--set``) are the sibling :mod:`common.run.arguments`.
"""

from __future__ import annotations

import dataclasses
import json
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from common.run.settings import LEGACY_EXTRA, Settings

S = TypeVar("S", bound=Settings)


# How class ids are numbered (tasks are contiguous ranges of them):
CLASS_ORDERS = {
    "natural": "the dataset's own label ids (image datasets) or first appearance (text files)",
    "alphabetical": "class names sorted; CLINC150's intents as the paper's code numbers them (each task mixes domains)",
    "domains": "CLINC150 only: the domains of domains.json in file order, so each task is whole domains "
    "(a harder, domain-grouped split than the paper's)",
}
DEFAULT_CLASS_ORDER = {"clinc150": "alphabetical"}  # every other dataset: "natural"
# The datasets whose class order the setting data.classes sets (textfile in client/text_datasets.py, imagefolder in
# client/image_datasets.py); the others take theirs from their own files, which the coordinator never reads.
CLASSES_FROM_SETTING = ("textfile", "imagefolder")
# The backbone of a run that names none: your own text gets the pretrained MiniLM (the text presets'), every
# other dataset the random-init tiny BERT of the tests (the image presets name their ViT).
DEFAULT_BACKBONE = {"textfile": "minilm"}  # every other dataset: "tiny-bert"

# FisherAvg's diagonal Fisher F = E_x E_y [(d log p(y|x) / d theta)^2] over a client's samples, summed:
FISHER_ESTIMATORS = {
    "sampled": "per sample, y drawn from the model's p(y|x) (Matena & Raffel's Monte Carlo estimate)",
    "expected": "per sample, every class y weighted by p(y|x) (the exact expectation; one backward per class)",
    "reference": "per sample, the true label's squared gradient weighted by p(y|x) (the paper's public code)",
    "batch": "mini-batch gradients of the loss, sum_b |b| g_b^2 (cheap; the empirical Fisher of batches)",
}
# The estimators whose client Fisher is a sum over the shard's samples (the paper's code); the others are
# means. EWC's merge divides a sum by the samples, FisherAvg's multiplies a mean by them.
FISHER_SUMMED = frozenset({"reference"})


def _integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# What a value of each kind of RunConfig field (its annotation) must be; settings sections check their own
# (common/run/settings.py). A float field takes an integer too.
FIELD_KINDS: dict[str, Callable[[Any], bool]] = {
    "bool": lambda v: isinstance(v, bool),
    "int": _integer,
    "float": lambda v: isinstance(v, numbers.Real) and not isinstance(v, bool),
    "str": lambda v: isinstance(v, str),
    "list[int]": lambda v: isinstance(v, list) and all(_integer(x) for x in v),
}


LEGACY_METHOD_KEY = "strategy"  # the key ``method`` had until wire version 3; still read, never written
# The legacy ``extra`` key whose section is the run's method's (``ncm.rp_dim`` as well as ``ridge.rp_dim``): only the
# registry knows it, so ``common.methods.checks.validate`` places it; every other key moves when a RunConfig is built.
LEGACY_BY_METHOD = "rp_dim"


def current_keys(values: dict[str, Any]) -> dict[str, Any]:
    """A configuration's values with the earlier name of ``method`` (:data:`LEGACY_METHOD_KEY`, in configuration
    files, result cells and state directories written before wire version 3) read as ``method``."""
    if LEGACY_METHOD_KEY not in values:
        return values
    if "method" in values:
        raise ValueError(f"both 'method' and its earlier name {LEGACY_METHOD_KEY!r} are set: keep 'method'")
    return {("method" if k == LEGACY_METHOD_KEY else k): v for k, v in values.items()}


@dataclass
class RunConfig:
    # --- run
    run_id: str = "run"  # names the run; every message carries it
    method: str = "lorm"  # a method of common.methods.registry() (lorm-sim --help lists them); its server half is
    #                       a Strategy (server/strategies), its client half a ClientMethod (client/methods)
    seed: int = 42  # seeds the partition, the LoRA inits, the head init and local training
    # --- data
    dataset: str = "synthetic-text"  # a key of client.datasets.DATASETS
    data_dir: str = ""  # where datasets live on disk ("" -> $LORM_DATA_DIR)
    num_tasks: int = 2  # tasks: contiguous class ranges in the class order below (0: chosen from the data)
    class_order: str = ""  # "" -> the dataset's (CLINC150: "alphabetical"; others: "natural"); see CLASS_ORDERS
    task_sizes: list[int] = field(default_factory=list)  # classes per task ([] -> as equal as possible)
    num_classes: int = 0  # 0 -> all classes of the dataset
    train_per_class: int = 0  # cap on training samples per class (0 = all); for small runs
    test_per_class: int = 0  # cap on test samples per class (0 = all)
    # --- federation
    num_clients: int = 3  # N
    beta: float = 0.5  # Dirichlet concentration of the per-class client split
    min_client_samples: int = 6  # the split is redrawn until each client has this many per task
    # --- model
    backbone: str = ""  # a key of client.backbone_builders.BACKBONES, or a local path ("" -> DEFAULT_BACKBONE's)
    max_length: int = 32  # text: tokens per sample (0: the training samples' 99th percentile, capped by the model)
    model_seed: int = 0  # seeds random-init backbones (tests) so every client builds the same W0
    rank: int = 1  # LoRA rank r
    lora_scale: float = 1.0  # multiplies B @ A; 1 as in the reference (no alpha / r)
    # --- training (per client, per round)
    rounds_per_task: int = 5  # rounds alternate B, A, B, A, B
    local_epochs: int = 5  # E
    batch_size: int = 16
    lr: float = 1e-2  # head learning rate
    lr_lora: float = 0.0  # LoRA factor learning rate (0 -> same as lr)
    weight_decay: float = 0.0  # AdamW weight decay (the reference runs use 0)
    # --- merging
    gamma_backbone: float = 0.0  # Gram decay of LoRA layers; 0 -> clients send diagonals only
    gamma_head: float = 0.5  # Gram decay of the classifier head
    gram_passes: int = 1  # passes over the training data per Gram computation
    gram_padding: bool = False  # text: count padding tokens' rows in the backbone Grams (the reference pads
    #                             the whole split to its longest utterance and counts every row)
    train_dropout: bool = True  # the backbone's dropout during local training (the reference trains in train mode)
    fisher: str = "sampled"  # the diagonal Fisher estimator of FisherAvg and EWC, one of FISHER_ESTIMATORS
    fisher_batch: int = 1  # samples per backward pass of the per-sample estimators (sampled, expected,
    #                        reference): >1 rebuilds each sample's gradient from the layers' rows
    #                        (client/persample.py; equal up to float rounding, fewer, larger kernels)
    # --- execution
    device: str = "auto"  # "auto" -> cuda when available, else cpu
    threads: int = 0  # torch intra-op threads per process (0 -> torch's default)
    deterministic: bool = False  # clients use deterministic kernels only (client.runtime.use_deterministic):
    #                              a GPU run then repeats bit for bit; slower, and an op without one fails by name
    settings: dict[str, dict[str, Any]] = field(default_factory=dict)  # typed settings set by section -> key
    #   (common/run/settings.py: "data" and each method's, e.g. {"ridge": {"rp_dim": 5000}}; --set ridge.rp_dim=5000)
    extra: dict[str, Any] = field(default_factory=dict)  # earlier versions' untyped settings: each key moves into
    #   its section of ``settings`` (common.run.settings.LEGACY_EXTRA), over what ``settings`` has; left empty
    #   (LEGACY_BY_METHOD once common.methods.checks.validate has placed it)

    def __post_init__(self) -> None:
        problems = self._check_types()
        if problems:  # the checks below compare values: a value of the wrong kind would break them
            raise ValueError("invalid run configuration: " + "; ".join(problems))
        if self.num_clients < 1:
            problems.append(f"num_clients must be >= 1, got {self.num_clients}")
        if self.num_tasks < 0:
            problems.append(f"num_tasks must be >= 1, or 0 to choose it from the data, got {self.num_tasks}")
        if not self.beta > 0:
            problems.append(f"beta must be > 0, got {self.beta}")
        if self.rank < 1:
            problems.append(f"rank must be a positive integer, got {self.rank}")
        if self.rounds_per_task < 1:
            problems.append(f"rounds_per_task must be >= 1, got {self.rounds_per_task}")
        if self.local_epochs < 0:
            problems.append(f"local_epochs must be >= 0, got {self.local_epochs}")
        if self.batch_size < 1:
            problems.append(f"batch_size must be >= 1, got {self.batch_size}")
        for name in ("gamma_backbone", "gamma_head"):
            value = getattr(self, name)
            if not 0.0 <= value <= 1.0:
                problems.append(f"{name} must lie in [0, 1], got {value}")
        if self.gram_passes < 1:
            problems.append(f"gram_passes must be >= 1, got {self.gram_passes}")
        if not self.class_order:
            self.class_order = DEFAULT_CLASS_ORDER.get(self.dataset, "natural")
        if not self.backbone:
            self.backbone = DEFAULT_BACKBONE.get(self.dataset, "tiny-bert")
        if self.class_order not in CLASS_ORDERS:
            problems.append(f"class_order must be one of {sorted(CLASS_ORDERS)}, got {self.class_order!r}")
        if self.fisher_batch < 1:
            problems.append(f"fisher_batch must be >= 1, got {self.fisher_batch}")
        if self.fisher not in FISHER_ESTIMATORS:
            problems.append(f"fisher must be one of {sorted(FISHER_ESTIMATORS)}, got {self.fisher!r}")
        problems += self._check_extra()
        if problems:
            raise ValueError("invalid run configuration: " + "; ".join(problems))

    def _check_types(self) -> list[str]:
        """Each value of the field's kind (a JSON file or ``--set`` can hold any), named when it is not."""
        problems = []
        for f in dataclasses.fields(self):
            value, kind = getattr(self, f.name), str(f.type)
            if kind in FIELD_KINDS and not FIELD_KINDS[kind](value):
                problems.append(f"{f.name} expects {kind}, got {type(value).__name__} {value!r}")
        return problems

    def _check_extra(self) -> list[str]:
        """Move legacy ``extra`` keys into ``settings`` (the problems found): each to its section, but
        :data:`LEGACY_BY_METHOD`, which waits in ``extra`` for the registry's check (``common.methods.checks``) to
        place it in the section of the run's method."""
        if not isinstance(self.settings, dict) or not isinstance(self.extra, dict):
            return [f"settings and extra must be objects, got {self.settings!r} and {self.extra!r}"]
        self.settings = {
            name: dict(values) if isinstance(values, dict) else values for name, values in self.settings.items()
        }
        problems = []
        for key, value in self.extra.items():
            if key not in LEGACY_EXTRA:
                problems.append(
                    f"unknown extra key {key!r}; settings go by section (--describe METHOD), "
                    f"known extra keys: {sorted(LEGACY_EXTRA)}"
                )
            elif key != LEGACY_BY_METHOD:
                section, name = LEGACY_EXTRA[key]
                self.settings.setdefault(section, {})[name] = value
        self.extra = {key: value for key, value in self.extra.items() if key == LEGACY_BY_METHOD}
        return problems

    def section(self, cls: type[S]) -> S:
        """The typed settings of section ``cls.section``: its defaults, with the values this run sets."""
        return cls.parse(self.settings.get(cls.section, {}))

    @property
    def lora_lr(self) -> float:
        return self.lr_lora or self.lr

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.from_dict(json.loads(text))

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> RunConfig:
        values = current_keys(values)
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown run configuration keys: {unknown}; known: {sorted(known)}")
        return cls(**values)

    def replace(self, **changes: Any) -> RunConfig:
        return dataclasses.replace(self, **changes)


# Settings that only the client they describe may choose: where its data and weight files lie
# on its disk. The coordinator's configuration names none of them; each client gives its own through its
# flags and environment (client/local.py), and refuses a coordinator's configuration that sets one.
CLIENT_LOCAL: dict[str, str] = {
    "data_dir": "--data-dir or LORM_DATA_DIR",
    "data.train_file": "--train-file",
    "data.test_file": "--test-file",
    "data.root": "--image-root",
    "data.clients_dir": "--data and --test-data",
    "model.weights": "--weights or LORM_MODEL_WEIGHTS",
}


def client_local_values(config: RunConfig) -> dict[str, Any]:
    """The client-local settings (:data:`CLIENT_LOCAL`) that ``config`` sets, ``dotted key -> value``."""
    found: dict[str, Any] = {}
    for key in CLIENT_LOCAL:
        section, _, name = key.rpartition(".")
        value = config.settings.get(section, {}).get(name) if section else getattr(config, key)
        if value:
            found[key] = value
    return found


def without_client_local(config: RunConfig) -> RunConfig:
    """``config`` without its client-local settings: what a coordinator of the run may send its clients."""
    settings = {name: dict(values) for name, values in config.settings.items()}
    for key in CLIENT_LOCAL:
        section, _, name = key.rpartition(".")
        if section:
            settings.get(section, {}).pop(name, None)
    return config.replace(data_dir="", settings={name: values for name, values in settings.items() if values})
