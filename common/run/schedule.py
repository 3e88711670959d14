"""The run's schedule of classes by name: the tasks in order, each a list of class names.

A class-incremental run learns its classes task by task; the head's row ``i`` is the ``i``-th name of
the schedule read in order, and task ``t`` is the contiguous range of its names. The coordinator states
the schedule from its configuration alone (the setting ``data.classes``, cut into ``num_tasks`` tasks or
``task_sizes``), without holding any data, and sends it at Join; a client whose data is its own
(``lorm-client --data``) matches its labels to it by name. A schedule is plain lists so that it can grow:
a task appended is one more list.
"""

from __future__ import annotations

import argparse
import functools
import json
from collections import Counter
from pathlib import Path
from typing import Any

from common.run.arguments import config_from_args
from common.run.config import CLASSES_FROM_SETTING, RunConfig
from common.run.partition import task_ranges
from common.run.settings import DataSettings

Schedule = list[list[str]]  # schedule[t]: task t's class names, in head order

MAX_CLASSES = 100_000  # a schedule longer than this is refused on receipt (the head would not fit anyway)
MAX_NAME = 1_000  # characters of one class name
MAX_TASK = 10_000  # classes of one task appended while the run lives (lorm-admin add-task)


def configured_classes(config: RunConfig) -> list[str] | None:
    """The class names in head order when the configuration fixes them, else ``None``.

    As ``client.datasets.load_dataset`` orders them: the setting ``data.classes`` (read by the datasets of
    :data:`CLASSES_FROM_SETTING` only), sorted under ``class_order`` "alphabetical", the first
    ``num_classes`` of them when that is set."""
    given = config.section(DataSettings).classes
    if config.dataset not in CLASSES_FROM_SETTING or not given:
        return None
    names = sorted(given) if config.class_order == "alphabetical" else list(given)
    return names[: config.num_classes] if config.num_classes else names


def class_schedule(config: RunConfig) -> Schedule | None:
    """The configuration's tasks as lists of class names (:func:`configured_classes` cut by
    ``num_tasks`` / ``task_sizes``, as every party cuts the class ids), or ``None`` when it names no classes."""
    names = configured_classes(config)
    if names is None:
        return None
    return [names[lo:hi] for lo, hi in task_ranges(len(names), config.num_tasks, config.task_sizes)]


def scheduled_classes(schedule: Schedule) -> list[str]:
    """Every class of ``schedule`` in head order."""
    return [name for task in schedule for name in task]


def schedule_ranges(schedule: Schedule) -> list[tuple[int, int]]:
    """Each task's ``[lo, hi)`` range of class ids."""
    ranges, lo = [], 0
    for task in schedule:
        ranges.append((lo, lo + len(task)))
        lo += len(task)
    return ranges


def check_schedule(schedule: Schedule, where: str) -> None:
    """``ValueError`` naming ``where`` unless ``schedule`` has tasks, each of classes, every name a non-empty
    string of at most :data:`MAX_NAME` characters and used once, at most :data:`MAX_CLASSES` in all."""
    names = scheduled_classes(schedule)
    if not schedule or any(not task for task in schedule):
        raise ValueError(f"{where}: a schedule is one or more tasks of one or more classes, got {schedule!r:.200}")
    if len(names) > MAX_CLASSES:
        raise ValueError(f"{where}: {len(names)} classes, more than the {MAX_CLASSES} accepted")
    bad = [n for n in names if not isinstance(n, str) or not n or len(n) > MAX_NAME]
    if bad:
        raise ValueError(f"{where}: class names must be strings of 1 to {MAX_NAME} characters, got {bad[:3]!r:.200}")
    repeated = sorted(name for name, count in Counter(names).items() if count > 1)
    if repeated:
        raise ValueError(f"{where}: class names must be unique, repeated: {repeated[:5]}")


def head_classes(config: RunConfig, scheduled: int) -> int:
    """Rows of the model's head for a run of ``scheduled`` classes: ``data.max_classes`` when the clients own
    their data and it is set (the capacity of a schedule that grows while the run lives; the rows past the
    scheduled classes are in no task, so no loss or prediction reads them), else ``scheduled``."""
    data = config.section(DataSettings)
    return max(data.max_classes, scheduled) if data.owned else scheduled


def run_tasks(config: RunConfig, head: int) -> list[tuple[int, int]]:
    """The run's tasks as ``[lo, hi)`` class-id ranges, for a head of ``head`` rows: of the configured classes
    when the clients own their data (the head may hold more rows: :func:`head_classes`), else of every row."""
    names = configured_classes(config) if config.section(DataSettings).owned else None
    return task_ranges(len(names) if names is not None else head, config.num_tasks, config.task_sizes)


def with_schedule(config: RunConfig, schedule: Schedule) -> RunConfig:
    """``config`` whose classes and tasks are ``schedule``'s (``data.classes`` in head order, ``task_sizes``
    and ``num_tasks`` its cut): what a coordinator whose operator appended tasks sends at Join, so that
    every party cuts the same ranges (:func:`run_tasks`, ``client.owned.check_tasks``). The configuration
    itself when it cuts ``schedule`` already."""
    if class_schedule(config) == schedule:
        return config
    settings = {name: dict(values) for name, values in config.settings.items()}
    settings["data"] = {**settings.get("data", {}), "classes": scheduled_classes(schedule)}
    return config.replace(
        settings=settings,
        class_order="natural",  # the names in the order given, as the schedule holds them
        num_classes=0,
        num_tasks=len(schedule),
        task_sizes=[len(task) for task in schedule],
    )


def bare_config(config: RunConfig) -> dict[str, Any]:
    """``config`` as JSON values without its schedule (classes and their cut): what stays while an open run's
    schedule grows."""
    values = json.loads(config.to_json())
    for key in ("class_order", "num_classes", "num_tasks", "task_sizes"):
        values.pop(key)
    values["settings"].get("data", {}).pop("classes", None)
    return values


def same_but_schedule(a: RunConfig, b: RunConfig) -> bool:
    """Whether ``a`` and ``b`` are one run's configuration, but for its schedule (classes and their cut)."""
    return bare_config(a) == bare_config(b)


def parse_task(text: str, where: str) -> list[str]:
    """One task written ``a,b,c``: its class names, stripped of surrounding spaces; ``ValueError`` naming
    ``where`` when a name is empty."""
    names = [name.strip() for name in text.split(",")]
    if not text.strip() or any(not name for name in names):
        raise ValueError(f"{where}: a task is class names separated by commas, got {text!r:.200}")
    return names


def read_schedule(path: str | Path) -> Schedule:
    """A schedule file: one task per line, its class names separated by commas (``alarm,balance``); blank
    lines and lines starting with ``#`` are skipped. A name cannot hold a comma or a line break."""
    text = Path(path).read_text(encoding="utf-8-sig")
    tasks = []
    for number, line in enumerate(text.splitlines(), 1):
        if line.strip() and not line.lstrip().startswith("#"):
            tasks.append(parse_task(line, f"{path} line {number}"))
    check_schedule(tasks, f"--schedule {path}")
    return tasks


OPEN_HELP = (
    "data.open=true: after its last task the run waits for the operator's next one (lorm-admin add-task) or its "
    "end (lorm-admin finish) instead of ending"
)


def add_schedule_arguments(parser: argparse.ArgumentParser, open_help: str = OPEN_HELP) -> None:
    """``--schedule FILE``, repeated ``--task a,b,c`` and ``--open`` (``open_help``: what it does in this program):
    the run's schedule by name."""
    g = parser.add_argument_group("the schedule of a run on the clients' own data (data.owned)")
    g.add_argument(
        "--schedule",
        default="",
        metavar="FILE",
        help="the run's tasks: one per line, class names separated by commas (blank lines and # comments "
        "skipped); sets data.owned, data.classes and task_sizes",
    )
    g.add_argument(
        "--task",
        action="append",
        default=[],
        metavar="A,B,C",
        help="one task's class names, separated by commas; repeat in task order (instead of --schedule)",
    )
    g.add_argument(
        "--open",
        action="store_true",
        help=open_help,
    )


def schedule_from_args(args: argparse.Namespace, values: dict[str, Any]) -> dict[str, Any]:
    """A configuration's ``values`` (not yet checked: ``config_from_args(args, then=...)``) with the schedule of
    ``--schedule`` or ``--task`` (``data.owned``, ``data.classes`` in task order, ``task_sizes``, ``num_tasks``)
    and ``--open``, so that settings which need a schedule (``data.max_classes``) are checked with it;
    ``ValueError`` for an unusable schedule."""
    if args.schedule and args.task:
        raise ValueError("--schedule FILE and --task A,B,C both give the schedule: pass one of them")
    schedule: Schedule | None = None
    if args.schedule:
        schedule = read_schedule(args.schedule)
    elif args.task:
        schedule = [parse_task(text, f"--task {text!r:.100}") for text in args.task]
        check_schedule(schedule, "--task")
    settings = {name: dict(section) for name, section in values.get("settings", {}).items()}
    data = settings.setdefault("data", {})
    if args.open:
        data["open"] = True
    if schedule is None:
        return {**values, "settings": settings}
    data.update(owned=True, classes=scheduled_classes(schedule))
    return {
        **values,
        "settings": settings,
        "class_order": "natural",  # the names in the order given
        "num_classes": 0,
        "num_tasks": len(schedule),
        "task_sizes": [len(task) for task in schedule],
    }


def config_with_schedule(args: argparse.Namespace) -> RunConfig:
    """The run of a program's configuration flags and schedule flags (:func:`add_schedule_arguments`), built as
    one: ``ValueError`` (or ``OSError`` for an unreadable file) when it is unusable. Its settings are checked with
    the schedule by the caller's ``common.methods.checks.validate``."""
    return config_from_args(args, then=functools.partial(schedule_from_args, args))
