"""The registry of methods: each name maps to its server half, its client half and its aggregator.

A method is one unit with two halves that run in different processes: the server half (a
``server.strategies.base.Strategy``: plans and merging) and the client half (a
``client.methods.base.ClientMethod``: what a client trains, its loss, what it computes and
sends). Neither package may import the other, so the registry names both halves by import
path (``"package.module:Class"``, like entry points); the coordinator resolves only the
server half (``server.strategies.make_strategy``), a client only the client half
(``client.methods.client_method``). How a step's updates are checked and folded into running
sums is the method's shared math: its aggregator factory (``common/aggregation/``, or its slice),
which both sides build with ``common.aggregation.base.make_aggregator`` (a client in a secure step masks what the
coordinator would have folded).

Several methods share a client half: every LoRA method trains the same way, so a new method
that trains like an existing one and has no shared part of its own (no settings, no instruction, no
declaration or aggregator of its own) adds only its server half and one line here (:data:`BUILT_IN`).

A method may instead be a slice: a module of this package (``common/methods/<name>.py``) that holds its
shared part, which both halves import: its typed settings, its steps' instruction (a
``common.wire.instructions.Instruction`` subclass), what its steps declare, the names of its own tensors, its
aggregator, and its registration, ``METHOD = Method(...)``; a family of methods that share a slice (the
closed-form heads share their settings) registers them all, ``METHODS = (Method(...), ...)``. The registry finds
every slice here (:func:`registry`): adding a method is then its slice, its server half and its client half, three
files. The one module here that is no slice, ``checks.py``, checks a run's configuration against the registry
(``validate``: what ``RunConfig`` cannot check alone).
"""

from __future__ import annotations

import functools
import importlib
import pkgutil
from collections.abc import Callable
from dataclasses import dataclass, field
from types import ModuleType
from typing import TYPE_CHECKING, Any

from common.run.settings import (
    DataSettings,
    DpSettings,
    ModelSettings,
    RobustSettings,
    SecAggSettings,
    Settings,
)

if TYPE_CHECKING:
    from torch import nn

    from common.run.config import RunConfig
    from common.wire.messages import ModelSpec, RoundPlan

# The client halves (client/methods/) that several methods train with; a slice names its own.
LORA = "client.methods.lora:LoRATrainer"  # LoRA factors + head with ACE, then a Gram pass
DENSE = "client.methods.dense:DenseTrainer"  # every backbone weight + head with ACE (and Fisher when asked)

# The steps that read a task's records, as (phase, instruction kind), which a method's plans may hold: a client
# refuses any other (client/worker.py), whatever the plan's phase says about itself. Evaluations are not listed:
# they read the client's test split, and the client half's mode is checked for them.
LORA_ROUNDS = frozenset({("train", "lora")})  # LoRA training rounds (FedAvg-LoRA)
LORM_STEPS = LORA_ROUNDS | {("task_gram", "lora")}  # LoRA rounds with Grams, then a task's Gram step (LoRM)
DENSE_ROUNDS = frozenset({("train", "dense")})  # full fine-tuning rounds
FEATURES_STEP = frozenset({("features", "features")})  # statistics of the task's features (closed-form heads)

# The modules of this package that register no method: the checks of a run's configuration against the registry.
NOT_SLICES = frozenset({"checks"})


@dataclass(frozen=True)
class Method:
    """One method: its name (``RunConfig.method``), its two halves, a line of help, its settings and its
    aggregator."""

    name: str
    server: str  # "server.strategies.<module>:<Strategy subclass>"
    client: str  # "client.methods.<module>:<ClientMethod subclass>"
    help: str
    settings: type[Settings] | None = None  # its typed settings (its slice's), read by both halves
    # the layers on the target modules: "lora", "vera" or "ia3" (the modules of common/adapters/)
    adapter: str = "lora"
    # what puts them on a backbone built with LoRA's (backbone, run config), in place; None: LoRA's stay
    apply_adapter: Callable[[nn.Module, RunConfig], object] | None = None
    # the tensors an update of a step carries, when the method declares its own (a slice; otherwise the way
    # of training's declaration, common.aggregation.declared.declared_tensors):
    # (plan, model spec, run config) -> name -> shape
    declare: Callable[[RoundPlan, ModelSpec, RunConfig], dict[str, tuple[int, ...]]] | None = None
    # how a step's updates fold: "common.<module>:<factory>", a common.aggregation.base.AggregatorFactory
    # (plan, model spec, run config) -> a fresh aggregator of the plan's step (common.aggregation.base.make_aggregator)
    aggregator: str = field(kw_only=True)
    # the record-reading steps its plans hold (LORM_STEPS, ...): a client refuses a plan of any other
    steps: frozenset[tuple[str, str]] = field(kw_only=True)
    # whether it takes tasks an operator adds while the run lives (data.open): not a method that sizes its state by
    # the number of tasks at the start (CODA-Prompt: each task's share of the prompt components)
    open_schedule: bool = field(default=True, kw_only=True)
    # whether a run of it may set the dp section (common/privacy/): every record it reads enters only statistics
    # that the coordinator noises (the closed-form heads on W0), never training that the noise does not cover
    private: bool = field(default=False, kw_only=True)
    # whether a run of it may set the dp section with dp.mode = local (common/privacy/training.py): its client half
    # trains with DP-SGD (the shared loop, no regulariser) and noises every Gram it sends, so each client protects its
    # own records against everyone else
    dp_training: bool = field(default=False, kw_only=True)
    # whether a run of it may set dp.mode = client (common/privacy/client_level.py): its merge is a plain mean of the
    # clients' factors, deltas and head, which the coordinator can take as clipped changes with equal weights
    dp_client_level: bool = field(default=False, kw_only=True)
    # whether a run's figures depend on the clients' data only through sums over every client, so another split of the
    # same samples (another data.beta) gives the same figures: run config -> bool (None: never). The frozen heads
    # without per-client draws; :func:`split_invariant` adds what every method needs for it
    sums_only: Callable[[RunConfig], bool] | None = field(default=None, kw_only=True)


BUILT_IN: dict[str, Method] = {
    m.name: m
    for m in (
        Method(
            "lorm",
            "server.strategies.lorm:LoRM",
            LORA,
            "LoRM: alternating B/A rounds, closed-form merges",
            steps=LORM_STEPS,
            aggregator="common.aggregation.lora:lorm",
            dp_training=True,
        ),
        Method(
            "lorm-b-only",
            "server.strategies.lorm:LoRMBOnly",
            LORA,
            "ablation: LoRM training B every round (A stays its init)",
            steps=LORM_STEPS,
            aggregator="common.aggregation.lora:lorm",
            dp_training=True,
        ),
        Method(
            "lorm-avg-tasks",
            "server.strategies.lorm:LoRMAverageTasks",
            LORA,
            "ablation: tasks' residuals averaged instead of the task RegMean",
            steps=LORM_STEPS,
            aggregator="common.aggregation.lora:lorm",
            dp_training=True,
        ),
        Method(
            "lorm-seq",
            "server.strategies.lorm:LoRMSequential",
            LORA,
            "variant: each task's LoRA a residual on the earlier tasks'",
            steps=LORM_STEPS,
            aggregator="common.aggregation.lora:lorm",
            dp_training=True,
        ),
        Method(
            "fedavg-lora",
            "server.strategies.fedavg_lora:FedAvgLoRA",
            LORA,
            "FedAvg of LoRA factors and head",
            steps=LORA_ROUNDS,
            aggregator="common.aggregation.lora:fedavg_lora",
            dp_training=True,
            dp_client_level=True,
        ),
        Method(
            "fedavg",
            "server.strategies.fedavg:FedAvg",
            DENSE,
            "FedAvg, full fine-tuning",
            steps=DENSE_ROUNDS,
            aggregator="common.aggregation.dense:fedavg",
            dp_training=True,
            dp_client_level=True,
        ),
        Method(
            "regmean",
            "server.strategies.regmean:RegMean",
            DENSE,
            "RegMean, full fine-tuning",
            steps=DENSE_ROUNDS,
            aggregator="common.aggregation.dense:regmean",
        ),
        Method(
            "fisheravg",
            "server.strategies.fisheravg:FisherAvg",
            DENSE,
            "Fisher averaging, full fine-tuning",
            steps=DENSE_ROUNDS,
            aggregator="common.aggregation.dense:fisheravg",
        ),
        Method(
            "head-only",
            "server.strategies.head_only:HeadOnly",
            LORA,
            "toy: the head alone on W0, heads averaged",
            steps=LORA_ROUNDS,
            aggregator="common.aggregation.lora:head_only",
        ),
    )
}


@functools.cache
def registry() -> dict[str, Method]:
    """Every method: the built-in ones, then each slice of this package (its ``METHOD``, or its ``METHODS``),
    imported on the first call (a slice imports the shared modules that import this one)."""
    methods = dict(BUILT_IN)
    for info in pkgutil.iter_modules(__path__):
        if info.name in NOT_SLICES:
            continue
        module = importlib.import_module(f"{__name__}.{info.name}")
        for found in slice_methods(module):
            if found.name in methods:
                raise ValueError(f"method {found.name!r} of {module.__name__} is registered twice")
            methods[found.name] = found
    return methods


def slice_methods(module: ModuleType) -> tuple[Method, ...]:
    """What the slice ``module`` registers: its ``METHOD``, or its ``METHODS``, a tuple of the methods of a family
    that shares one slice (the closed-form heads share their settings); ``TypeError`` for anything else."""
    one, family = getattr(module, "METHOD", None), getattr(module, "METHODS", None)
    if isinstance(one, Method) and family is None:
        return (one,)
    if one is None and isinstance(family, tuple) and family and all(isinstance(m, Method) for m in family):
        return family
    raise TypeError(f"slice {module.__name__} must define METHOD = Method(...) or METHODS = (Method(...), ...)")


@functools.cache
def sections() -> dict[str, type[Settings]]:
    """Every settings section a run may set: the dataset loaders', the backbones', the guard's, secure aggregation's,
    differential privacy's and each method's."""
    return {
        DataSettings.section: DataSettings,
        ModelSettings.section: ModelSettings,
        RobustSettings.section: RobustSettings,
        SecAggSettings.section: SecAggSettings,
        DpSettings.section: DpSettings,
    } | {m.settings.section: m.settings for m in registry().values() if m.settings is not None}


def method(name: str) -> Method:
    """The registered method ``name``; ``ValueError`` naming the known ones otherwise."""
    methods = registry()
    if name not in methods:
        raise ValueError(f"unknown method {name!r}; known: {sorted(methods)}")
    return methods[name]


def split_invariant(config: RunConfig) -> bool:
    """Whether ``config``'s figures are the same under any split of its samples over its clients (any ``beta``): its
    method's statistics are sums over every client (``Method.sums_only``), and nothing acts on a client's own part
    of them: no robust screening, no secure aggregation (each client's terms rounded to fixed point) and no
    differential privacy (noise, clipping). lorm-bench then runs one beta and reuses it for the others."""
    check = method(config.method).sums_only
    return (
        check is not None
        and check(config)
        and not config.section(RobustSettings).enabled
        and not config.section(SecAggSettings).enabled
        and not config.section(DpSettings).enabled
    )


def describe(name: str) -> str:
    """What ``lorm-sim --describe NAME`` prints: a method's halves and settings, or a settings section's."""
    if name in registry():
        m = registry()[name]
        lines = [f"{m.name}: {m.help}", f"  server half: {m.server}", f"  client half: {m.client}"]
        lines.append(f"  aggregator: {m.aggregator}")
        settings = (
            m.settings.describe()
            if m.settings
            else [f"(no settings of its own; every run also has {', '.join(s + '.*' for s in ('data', 'model'))})"]
        )
        return "\n".join(lines + ["  settings (--set KEY=VALUE):"] + [f"    {line}" for line in settings])
    if name in sections():
        return "\n".join(
            [f"settings section {name} (--set KEY=VALUE):"] + [f"    {line}" for line in sections()[name].describe()]
        )
    raise ValueError(
        f"nothing to describe named {name!r}; methods: {sorted(registry())}; settings sections: {sorted(sections())}"
    )


def overview() -> str:
    """One line per method, for ``--help``."""
    return "methods (--describe METHOD for its settings):\n" + "\n".join(
        f"  {m.name:<18} {m.help}" for m in registry().values()
    )


def load_half(path: str, package: str) -> Any:
    """The object named by ``"module:attribute"``, which must live in ``package`` (a layer loads only its own half)."""
    module, sep, attribute = path.partition(":")
    if not sep or module.split(".")[0] != package:
        raise ValueError(f"expected a path 'module:attribute' inside package {package!r}, got {path!r}")
    return getattr(importlib.import_module(module), attribute)
