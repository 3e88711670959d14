"""The run configuration: one dataclass, shared by coordinator, clients and the in-process engine.

It travels to clients as JSON (never pickle) so that every client derives the same tasks,
the same Dirichlet shards and the same model from it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import numbers
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from common.run.settings import LEGACY_EXTRA, DataSettings, DpSettings, RobustSettings, SecAggSettings, Settings

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
        problems += self._check_settings()
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

    def _check_settings(self) -> list[str]:
        """Move legacy ``extra`` keys into ``settings``, then parse every section (the problems found)."""
        from common.methods import registry, sections

        if not isinstance(self.settings, dict) or not isinstance(self.extra, dict):
            return [f"settings and extra must be objects, got {self.settings!r} and {self.extra!r}"]
        self.settings = {
            name: dict(values) if isinstance(values, dict) else values for name, values in self.settings.items()
        }
        own = registry()[self.method].settings if self.method in registry() else None
        problems = []
        for key, value in self.extra.items():
            if key not in LEGACY_EXTRA:
                problems.append(
                    f"unknown extra key {key!r}; settings go by section (--describe METHOD), "
                    f"known extra keys: {sorted(LEGACY_EXTRA)}"
                )
                continue
            section, name = LEGACY_EXTRA[key]
            if key == "rp_dim" and own is not None and "rp_dim" in {f.name for f in dataclasses.fields(own)}:
                section = own.section  # ncm's rp_dim as well as ridge's
            self.settings.setdefault(section, {})[name] = value
        self.extra = {}
        for name, values in self.settings.items():
            if name not in sections():
                problems.append(f"unknown settings section {name!r}; known: {sorted(sections())}")
                continue
            try:
                sections()[name].parse(values)
            except ValueError as err:
                problems.append(str(err))
        if not problems:  # a threshold is safe or not only against the run's number of clients
            try:
                self.section(SecAggSettings).check_clients(self.num_clients)
            except ValueError as err:
                problems.append(str(err))
        if not problems:
            problems += self._check_owned()
        if not problems:
            problems += self._check_private()
        return problems

    def _client_level_problems(self, known: Any) -> list[str]:
        """``dp.mode = client`` (DP-FedAvg): a plain-averaging method, the coordinator seeing each update (it clips
        them), a schedule fixed at the start (the budget is composed over its rounds), nothing else released."""
        from common.methods import registry

        if known is None or not known.dp_client_level:
            able = sorted(m.name for m in registry().values() if m.dp_client_level)
            return [f"dp.mode = client: client-level DP covers the plain-averaging methods {able}, not {self.method!r}"]
        if self.section(SecAggSettings).enabled:
            return [
                "dp.mode = client: the coordinator clips each client's change, so it must see the updates, which "
                "secure aggregation hides from it: set secagg.enabled=false, or dp.mode = local"
            ]
        if self.section(RobustSettings).enabled:
            return [
                "dp.mode = client with robust.enabled: the screening drops or scales updates by what the others "
                "sent, which the clipping's bound does not cover: the clip is the bound on a client's weight"
            ]
        if self.section(DataSettings).open:
            return [
                "dp.mode = client with data.open: the budget is composed over every round of the run, so its "
                "schedule must be fixed at the start"
            ]
        if self.section(DataSettings).validation:
            return ["dp.mode = client with data.validation: the validation accuracy would be released un-noised"]
        return []

    def _check_private(self) -> list[str]:
        """A run with a privacy budget (``dp.epsilon``) reads its training records only where the noise covers
        them: a method whose slice says so (``Method.private``), and no evaluation on held-back training records."""
        from common.methods import registry

        dp = self.section(DpSettings)
        if not dp.enabled:
            return []
        if dp.distributed and not self.section(SecAggSettings).enabled:
            return [
                "dp.mode = distributed: the clients' noise shares hide each other only inside a securely aggregated "
                "sum; without it the coordinator would see each client's statistics with a fraction of the noise. "
                "Set secagg.enabled=true, or dp.mode = central"
            ]
        if self.section(RobustSettings).enabled and dp.mode == "central":
            return [
                "dp.mode = central with robust.enabled: the screening drops or scales a client's un-noised statistics "
                "by the other clients' (one record can flip a whole client's verdict, which the clip does not bound) "
                "and its report of them is released un-noised: turn one of them off (local mode screens noised "
                "updates, which is post-processing)"
            ]
        if dp.colluders and not dp.distributed:
            return [
                f"dp.colluders={dp.colluders}: colluding clients matter only to the clients' noise shares of "
                f"dp.mode = distributed, not to dp.mode = {dp.mode}"
            ]
        if dp.distributed:
            from common.secagg.terms import threshold

            try:
                t = threshold(self.section(SecAggSettings), self.num_clients)
            except ValueError as err:
                return [str(err)]
            if dp.colluders >= t:
                return [
                    f"dp.colluders={dp.colluders} must be below the secure aggregation threshold {t} of "
                    f"num_clients={self.num_clients}: {dp.colluders} colluders' shares are known to the coordinator, "
                    "and a sum of t survivors needs an honest share to carry any noise"
                ]
        known = registry().get(self.method)
        if dp.mode == "client":
            return self._client_level_problems(known)
        if known is not None and known.dp_training and dp.mode != "local":
            either = " (record-level) or dp.mode=client (client-level, DP-FedAvg)" if known.dp_client_level else ""
            return [
                f"dp.epsilon: method {self.method!r} trains on its clients' records, and each client noises what it "
                f"trains and sends itself (DP-SGD): set dp.mode=local{either} (not {dp.mode!r})"
            ]
        if known is not None and known.private and dp.mode == "local":
            return [
                f"dp.mode = local: method {self.method!r} releases summed statistics, noised by the coordinator "
                "(central) or by the clients' shares under secure aggregation (distributed), not by each client alone"
            ]
        if known is not None and not (known.private or known.dp_training):
            private = sorted(m.name for m in registry().values() if m.private or m.dp_training)
            return [
                f"dp.epsilon: method {self.method!r} reads training records outside the noised statistics (its "
                f"training or its other steps): differential privacy covers only {private}"
            ]
        if self.section(DataSettings).validation:
            return [
                "dp.epsilon with data.validation: the validation samples are training records whose accuracy "
                "would be released un-noised; evaluate on the test split (data.validation=0)"
            ]
        return []

    def _check_owned(self) -> list[str]:
        """A run on the clients' own data names its classes (they label the data by name)."""
        data = self.section(DataSettings)
        if data.clients_dir and not data.owned:
            return ["data.clients_dir is the clients' own data: set data.owned=true too"]
        if data.owned and (self.dataset not in CLASSES_FROM_SETTING or not data.classes):
            return [
                "data.owned: the clients' own data is labelled by class name, so the configuration names the run's "
                f"classes in task order: data.classes, with dataset one of {list(CLASSES_FROM_SETTING)} "
                f"(got dataset {self.dataset!r}, {len(data.classes)} classes)"
            ]
        if (data.open or data.max_classes) and not data.owned:
            return ["data.open and data.max_classes are settings of a run on the clients' own data: set data.owned"]
        if data.owned and self.dataset == "textfile" and self.max_length == 0:
            # each client would count it from its own sentences: their models would differ, and the export's
            # tokenization would be no client's in particular
            return [
                "data.owned with max_length 0: each client would count the tokens a sentence keeps from its own "
                "data, and the clients' models would differ; set max_length to the largest of the sites' counts "
                "(--set max_length=N; each site's: lorm-sim --count-tokens ITS_TRAINING_FILE with the run's "
                "--preset and backbone)"
            ]
        if data.open:
            from common.methods import registry

            if self.method in registry() and not registry()[self.method].open_schedule:
                return [f"data.open: method {self.method!r} sizes its state by the tasks it starts with: none later"]
        if data.max_classes and data.max_classes < len(data.classes):
            return [
                f"data.max_classes={data.max_classes} is the head's rows, fewer than the {len(data.classes)} classes "
                "of data.classes: raise it, or 0 for exactly those classes"
            ]
        return []

    def section(self, cls: type[S]) -> S:
        """The typed settings of section ``cls.section``: its defaults, with the values this run sets."""
        return cls.parse(self.settings.get(cls.section, {}))

    def unread_sections(self) -> list[str]:
        """A warning for each settings section this run sets that its method does not read (another method's),
        naming the methods that do: such a section changes nothing, and whoever set it most likely meant another
        method. Not an error: a grid sets one section for all its methods, and a state directory or a cell written
        so must still load."""
        from common.methods import registry

        own = registry()[self.method].settings
        warnings = []
        for name in sorted(self.settings):
            readers = sorted(
                m.name for m in registry().values() if m.settings is not None and m.settings.section == name
            )
            if not readers or (own is not None and name == own.section):  # every run's section, or its own
                continue
            warnings.append(
                f"settings section {name!r} is read by {', '.join(readers)}, not by method {self.method!r}: "
                f"it changes nothing in this run"
            )
        return warnings

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


# Settings that only the client they describe may choose (issue 41, M6): where its data and weight files lie
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


def add_config_arguments(parser: argparse.ArgumentParser) -> None:
    """``--config FILE`` (JSON) and repeatable ``--set KEY=VALUE`` overrides of :class:`RunConfig`."""
    parser.add_argument("--preset", default="", help="start from a named configuration (common/run/presets.py)")
    parser.add_argument("--config", help="JSON file with RunConfig values")
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="override one RunConfig value (parsed as JSON when possible, else a string); a "
        "dotted KEY changes one key of a setting (ridge.rp_dim=5000, data.synthetic_test=5), "
        "and an object merges into the one there, key by key",
    )


def merged(values: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``values`` with ``changes`` on top; where both hold an object, merged key by key (at any depth)."""
    out = dict(values)
    for key, value in changes.items():
        out[key] = merged(out[key], value) if isinstance(value, dict) and isinstance(out.get(key), dict) else value
    return out


def key_path(key: str) -> list[str]:
    """The path of a ``--set`` key in a configuration's values.

    ``a.b.c`` names key ``c`` of object ``b`` of field ``a``; in a dotted key, a first part that
    is no :class:`RunConfig` field is a settings section: ``ridge.rp_dim`` is ``settings.ridge.rp_dim``.
    """
    parts = key.split(".")
    if parts[0] == LEGACY_METHOD_KEY:
        parts[0] = "method"
    if len(parts) > 1 and parts[0] not in {f.name for f in dataclasses.fields(RunConfig)}:
        parts = ["settings", *parts]
    if not all(parts):
        raise ValueError(f"--set expects KEY or dotted KEY.PART=VALUE, got key {key!r}")
    return parts


def set_value(values: dict[str, Any], key: str, value: Any) -> dict[str, Any]:
    """``values`` with the dotted ``key`` (:func:`key_path`) set to ``value`` (merged when both are objects)."""
    parts = key_path(key)
    change: Any = value
    for part in reversed(parts):
        change = {part: change}
    return merged(values, change)


def config_from_args(
    args: argparse.Namespace,
    base: dict[str, Any] | None = None,
    then: Callable[[dict[str, Any]], dict[str, Any]] | None = None,
) -> RunConfig:
    """Defaults < ``base`` < ``--preset`` < ``--config`` file < ``--set`` overrides (objects merge key by key),
    and last ``then`` (e.g. the schedule of ``--task``), before the configuration is checked."""
    from common.run.presets import preset

    values = current_keys(dict(base or {}))
    if args.preset:
        values = merged(values, current_keys(preset(args.preset)))
    if args.config:
        with open(args.config) as f:
            values = merged(values, current_keys(json.load(f)))
    for item in args.set:
        key, sep, raw = item.partition("=")
        if not sep:
            raise ValueError(f"--set expects KEY=VALUE, got {item!r}")
        try:
            value = json.loads(raw)
        except json.JSONDecodeError:
            value = raw
        values = set_value(values, key, value)
    return RunConfig.from_dict(then(values) if then is not None else values)
