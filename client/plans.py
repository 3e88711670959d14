"""What this client holds the coordinator's sizes and each of its plans to before it reads a record.

The coordinator chooses the run's sizes (tokens a sentence keeps, batch, epochs, Gram passes, threads, a ridge head's
random features, ...) and sends every plan; a client that took them on trust could be made to allocate without bound,
train for ever, or compute and release something its run's method never asks for. Each check names what it stops:

- **caps** (:func:`check_caps`, ``--max-size NAME=VALUE``): a configuration whose sizes exceed this client's caps is
  refused at Join, before anything is built; the defaults are far above every preset and survive a laptop.
- **the method's steps** (:func:`check_plan`): a step that reads a task's records (training, Grams, statistics,
  features) must be one of the (phase, instruction) pairs the run's method produces (``common.methods.Method.steps``),
  its task one this client cut, its classes that task's; otherwise it is refused, naming the pair. A relabelled Gram
  step (phase ``FEATURES``, a LoRA instruction asking for Grams) is such a pair.
- **evaluations** (``--max-evaluations``): each task's evaluations on this client's test split are counted, and those
  beyond the cap refused: each returns exact counts of right answers on the same records.

A refusal is :class:`PlanRefused`; the client then refuses the run and sends nothing more.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from common.methods import method
from common.run.config import RunConfig
from common.wire.messages import Phase, RoundPlan

# What a coordinator may ask at most, unless the client says otherwise (--max-size NAME=VALUE). Each is well above
# what any preset uses (the paper's ViT runs: rank 32, 10 rounds, 5 epochs, batch 16, 2 Gram passes).
DEFAULT_CAPS: dict[str, int] = {
    "run_id": 256,  # characters of the run's name, which every log line and file name of the run carries
    "rank": 256,  # LoRA rank: each adapted layer's factors grow with it
    "max_length": 4096,  # tokens a sentence keeps: activations grow with its square
    "batch_size": 4096,  # samples a training batch holds at once
    "fisher_batch": 4096,
    "local_epochs": 1000,  # passes over the shard in one round
    "rounds_per_task": 1000,
    "gram_passes": 100,  # passes over the shard in one Gram computation
    "threads": 1024,  # torch threads a process starts
    "rp_dim": 65_536,  # a closed-form head's random features: its Gram is rp_dim squared float64
    "num_classes": 100_000,  # the head's rows
    "num_tasks": 10_000,
}


class PlanRefused(ValueError):
    """A configuration or plan this client will not carry out; the message names the setting or the step."""


@dataclass(frozen=True)
class Caps:
    """This client's caps on the coordinator's sizes, and on evaluations per task."""

    sizes: dict[str, int] = field(default_factory=lambda: dict(DEFAULT_CAPS))
    max_evaluations: int = 8  # per task: an honest run evaluates each task's model once (again after a restart)


def _sizes(config: RunConfig) -> Iterable[tuple[str, Any]]:
    yield "run_id", len(config.run_id)
    for name in ("rank", "max_length", "batch_size", "fisher_batch", "local_epochs", "rounds_per_task"):
        yield name, getattr(config, name)
    for name in ("gram_passes", "threads", "num_classes", "num_tasks"):
        yield name, getattr(config, name)
    for section, values in config.settings.items():
        for key, value in values.items():
            if key == "rp_dim":
                yield f"{section}.rp_dim", value


def check_caps(config: RunConfig, caps: Caps) -> None:
    """``PlanRefused`` naming the first size of ``config`` above this client's cap."""
    for name, value in _sizes(config):
        cap = caps.sizes.get(name.rsplit(".", 1)[-1])
        if cap is not None and isinstance(value, int) and value > cap:
            raise PlanRefused(
                f"the coordinator's configuration sets {name}={value}, above this client's cap of {cap} "
                f"(--max-size {name.rsplit('.', 1)[-1]}=N raises it): refusing to take part"
            )


class PlanCheck:
    """Each plan of run ``config`` held to its method's steps and this client's cut of the tasks (``tasks``: each
    task's ``[lo, hi)`` head rows), and evaluations counted per task."""

    def __init__(self, config: RunConfig, tasks: list[tuple[int, int]], caps: Caps | None = None) -> None:
        self.config, self.tasks, self.caps = config, tasks, caps or Caps()
        self.steps = method(config.method).steps
        self.evaluations: dict[int, int] = {}

    def __call__(self, plan: RoundPlan) -> None:
        """``PlanRefused`` unless ``plan`` is a step this client carries out."""
        what = f"the coordinator's task {plan.task} {plan.phase.value} step {plan.round}"
        if plan.run_id != self.config.run_id:
            raise PlanRefused(f"{what} names run {plan.run_id!r:.100}, not this client's run {self.config.run_id!r}")
        if not 0 <= plan.task < len(self.tasks):
            raise PlanRefused(f"{what}: this client cut the run into {len(self.tasks)} tasks")
        lo, hi = self.tasks[plan.task]
        if tuple(plan.class_range) != (lo, hi) or not hi <= plan.seen_classes <= self.tasks[-1][1]:
            raise PlanRefused(
                f"{what} says its classes are {list(plan.class_range)} of {plan.seen_classes} seen; this client's "
                f"task {plan.task} holds head rows [{lo}, {hi})"
            )
        if plan.phase == Phase.EVALUATE:
            done = self.evaluations.get(plan.task, 0) + 1
            if done > self.caps.max_evaluations:
                raise PlanRefused(
                    f"{what}: evaluation {done} of task {plan.task}'s model on this client's test split, above its "
                    f"cap of {self.caps.max_evaluations} (--max-evaluations): each returns exact counts of right "
                    "answers"
                )
            self.evaluations[plan.task] = done
            return
        pair = (plan.phase.value, plan.instruction.KIND)
        if pair not in self.steps:
            raise PlanRefused(
                f"{what} asks for phase {pair[0]!r} with a {pair[1]!r} instruction, which method "
                f"{self.config.method} never produces (its steps: "
                f"{', '.join(f'{p} with {k}' for p, k in sorted(self.steps))}): refused"
            )


def add_caps_arguments(parser: argparse.ArgumentParser) -> None:
    """``--max-size NAME=VALUE`` (repeated) and ``--max-evaluations`` of ``lorm-client``."""
    g = parser.add_argument_group("this client's caps on the coordinator's sizes (it refuses a run above them)")
    g.add_argument(
        "--max-size",
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="raise or lower one cap; the caps and their defaults: "
        + ", ".join(f"{k} {v}" for k, v in DEFAULT_CAPS.items()),
    )
    g.add_argument(
        "--max-evaluations",
        type=int,
        default=Caps().max_evaluations,
        metavar="N",
        help="refuse more than N evaluations of one task's model on this client's test split (default %(default)s)",
    )


def caps_from_args(args: argparse.Namespace) -> Caps:
    sizes = dict(DEFAULT_CAPS)
    for item in args.max_size:
        name, sep, value = item.partition("=")
        if not sep or name not in DEFAULT_CAPS or not value.strip().isdigit():
            raise PlanRefused(f"--max-size: expected NAME=VALUE with NAME one of {sorted(DEFAULT_CAPS)}, got {item!r}")
        sizes[name] = int(value)
    if args.max_evaluations < 1:
        raise PlanRefused(f"--max-evaluations must be >= 1, got {args.max_evaluations}")
    return Caps(sizes, args.max_evaluations)
