"""The run's schedule of classes by name: the tasks in order, each a list of class names.

A class-incremental run learns its classes task by task; the head's row ``i`` is the ``i``-th name of
the schedule read in order, and task ``t`` is the contiguous range of its names. The coordinator states
the schedule from its configuration alone (the setting ``data.classes``, cut into ``num_tasks`` tasks or
``task_sizes``), without holding any data, and sends it at Join; a client whose data is its own
(``lorm-client --data``) matches its labels to it by name. A schedule is plain lists so that it can grow:
a task appended is one more list.
"""

from __future__ import annotations

from collections import Counter

from common.run.config import CLASSES_FROM_SETTING, RunConfig
from common.run.partition import task_ranges
from common.run.settings import DataSettings

Schedule = list[list[str]]  # schedule[t]: task t's class names, in head order

MAX_CLASSES = 100_000  # a schedule longer than this is refused on receipt (the head would not fit anyway)
MAX_NAME = 1_000  # characters of one class name


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
