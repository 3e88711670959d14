"""A client's own data (``lorm-client --data``), its labels matched by name to the run's schedule.

The other mode of a run, beside the Dirichlet shards of a common dataset: each client trains on the
data it holds and no one else sees. Its training data is a CSV or JSONL file of text and label (the
``textfile`` format, ``client.text_rows.text_rows``) or a folder of images in class-named subfolders;
``--test-data``, the same for its own test split (without it the client evaluates nothing). A label is
a class name of the run's schedule (``common.run.schedule``): a sample of task ``t``'s classes trains in
task ``t``; a label in no task is counted, reported once, and never trained on. A client may hold none
of a task's classes: its updates of that task then carry zero samples and add nothing to the sums.
"""

from __future__ import annotations

import logging
from collections import Counter
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from client.image_datasets import class_folders, image_files
from client.images import image_size, image_transforms
from client.splits import DatasetError, Splits
from client.text_rows import text_rows
from common.run.config import RunConfig
from common.run.partition import task_ranges
from common.run.schedule import Schedule, schedule_ranges, scheduled_classes
from common.run.settings import DataSettings

log = logging.getLogger("lorm.client")

TEXT_SUFFIXES = (".csv", ".tsv", ".jsonl", ".ndjson")  # the files client.text_rows.text_rows reads
SHOWN_LABELS = 5  # unscheduled labels named in the report (the count covers them all)


@dataclass(frozen=True)
class OwnData:
    """Where a client's own samples lie: a text file or an image folder each ("": no test split)."""

    train: str
    test: str = ""


def client_files(folder: str | Path, index: int) -> OwnData:
    """Client ``index``'s own data in a folder of every client's (``lorm-sim --set data.clients_dir=DIR``):
    ``DIR/client<i>.csv`` (or ``.jsonl``, ``.tsv``, ``.ndjson``) with an optional ``DIR/client<i>-test.csv``,
    or a folder ``DIR/client<i>/`` holding ``train`` and optionally ``test``, each a text file of those
    suffixes or a folder of class-named image folders."""
    root, name = Path(folder).expanduser(), f"client{index}"
    if not root.is_dir():
        raise FileNotFoundError(f"data.clients_dir = {str(root)!r}: no such folder")

    def found(base: Path, stem: str) -> str:
        candidates = [base / f"{stem}{suffix}" for suffix in TEXT_SUFFIXES] + [base / stem]
        return next((str(p) for p in candidates if p.exists()), "")

    train = found(root, name)
    if train and not Path(train).is_dir():
        return OwnData(train, found(root, f"{name}-test"))
    own = root / name
    if own.is_dir() and found(own, "train"):
        return OwnData(found(own, "train"), found(own, "test"))
    raise FileNotFoundError(
        f"data.clients_dir = {str(root)!r} holds no data of client {index}: expected {name}.csv (or "
        f"{', '.join(TEXT_SUFFIXES[1:])}), or a folder {name}/ with train.csv or train/ (and optionally test)"
    )


def _read(path: Path, config: RunConfig, index: dict[str, int]) -> tuple[str, list[Any], list[int], Counter[str]]:
    """``(kind, samples, class ids, unscheduled label -> samples)`` of one text file or image folder."""
    unscheduled: Counter[str] = Counter()
    if path.is_dir():
        samples, ids = [], []
        for name in class_folders(path):
            files = image_files(path / name)
            if name in index:
                samples += files
                ids += [index[name]] * len(files)
            elif files:
                unscheduled[name] += len(files)
        return "image", samples, ids, unscheduled
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder (a .csv or .jsonl of text and label, or a folder)")
    texts, ids = [], []
    for text, label in text_rows(path, config.section(DataSettings).label_column):
        if label in index:
            texts.append(text)
            ids.append(index[label])
        else:
            unscheduled[label] += 1
    return "text", texts, ids, unscheduled


def report_unscheduled(path: Path, unscheduled: Counter[str]) -> None:
    """One log line: how many samples of ``path`` carry a label in no task of the run, and which labels."""
    if not unscheduled:
        return
    labels = ", ".join(f"{label!r} ({n})" for label, n in sorted(unscheduled.items())[:SHOWN_LABELS])
    more = f" and {len(unscheduled) - SHOWN_LABELS} more" if len(unscheduled) > SHOWN_LABELS else ""
    count = sum(unscheduled.values())
    log.warning(
        "%s: %d %s a label in no task of the run, left out: %s%s",
        path,
        count,
        "sample has" if count == 1 else "samples have",
        labels,
        more,
    )


def check_tasks(config: RunConfig, schedule: Schedule) -> None:
    """``DatasetError`` unless ``schedule``'s tasks are the class ranges the configuration cuts (the ranges
    that the coordinator's plans and this client's worker use)."""
    ranges = task_ranges(len(scheduled_classes(schedule)), config.num_tasks, config.task_sizes)
    if schedule_ranges(schedule) != ranges:
        raise DatasetError(
            f"the run's schedule has tasks of {[len(t) for t in schedule]} classes, its configuration "
            f"(num_tasks={config.num_tasks}, task_sizes={config.task_sizes}) cuts {[hi - lo for lo, hi in ranges]}"
        )


def load_owned(config: RunConfig, schedule: Schedule, own: OwnData) -> Splits:
    """This client's samples, class ids in the schedule's order (``num_classes`` = every scheduled class,
    held here or not), cut to ``*_per_class``; samples of unscheduled labels reported and left out."""
    check_tasks(config, schedule)
    names = scheduled_classes(schedule)
    index = {name: i for i, name in enumerate(names)}
    kind, train_x, train_ids, unscheduled = _read(Path(own.train).expanduser(), config, index)
    report_unscheduled(Path(own.train), unscheduled)
    test_x: list[Any] = []
    test_ids: list[int] = []
    if own.test:
        test_kind, test_x, test_ids, unscheduled = _read(Path(own.test).expanduser(), config, index)
        report_unscheduled(Path(own.test), unscheduled)
        if test_kind != kind:
            raise DatasetError(f"--data {own.train} holds {kind} samples but --test-data {own.test} {test_kind}")
    data = config.section(DataSettings)
    transforms = image_transforms(data.transforms, image_size(data)) if kind == "image" else None
    splits = Splits(
        train_x,
        np.array(train_ids, dtype=np.int64),
        test_x,
        np.array(test_ids, dtype=np.int64),
        names,
        kind=kind,
        transforms=transforms,
    ).limited(0, config.train_per_class, config.test_per_class)
    if data.validation:
        splits = splits.validation(data.validation)
    held = np.bincount(splits.train_y, minlength=len(names))
    log.info(
        "own data %s: %d training samples of %d of the run's %d classes; per task %s",
        own.train,
        len(splits.train_y),
        int((held > 0).sum()),
        len(names),
        [int(held[lo:hi].sum()) for lo, hi in schedule_ranges(schedule)],
    )
    return splits
