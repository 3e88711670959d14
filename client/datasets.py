"""Datasets as raw samples with integer labels ``0..num_classes-1`` in the dataset's class order.

A dataset is loaded on each client from local disk (or generated, for tests); nothing about
it crosses the wire. Tasks are contiguous label ranges (``common.run.partition.task_ranges``).
Every on-disk dataset lives in ``data_dir(config) / <name>`` (``client.dataset_files``); text samples are
strings (``client.text_datasets``), image samples file paths or ``uint8 (H, W, 3)`` arrays
(``client.image_datasets``). This module holds the registry of the loaders, ``DATASETS``, and ``load_dataset``,
which orders and cuts the configured one into the run's ``Splits`` (``client.splits``).
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from client.image_datasets import cars196, cifar100, cub200, eurosat, imagefolder, imagenet_a, imagenet_r
from client.splits import DatasetError, Splits
from client.text_datasets import clinc150, synthetic_text, textfile
from common.run.config import RunConfig
from common.run.settings import DataSettings

DATASETS: dict[str, Callable[[RunConfig], Splits]] = {
    "synthetic-text": synthetic_text,
    "clinc150": clinc150,
    "textfile": textfile,
    "cifar100": cifar100,
    "imagenet-r": imagenet_r,
    "imagenet-a": imagenet_a,
    "eurosat": eurosat,
    "cars196": cars196,
    "cub200": cub200,
    "imagefolder": imagefolder,
}


def load_dataset(config: RunConfig) -> Splits:
    """The configured dataset, cut to ``num_classes`` / ``*_per_class``; every class must have training samples."""
    if config.dataset not in DATASETS:
        raise DatasetError(f"unknown dataset {config.dataset!r}; known: {sorted(DATASETS)}")
    if config.section(DataSettings).train_val and config.dataset != "clinc150":
        raise DatasetError(f"setting data.train_val is CLINC150's (its val split); dataset {config.dataset!r} has none")
    splits = DATASETS[config.dataset](config)
    if config.class_order == "alphabetical" and splits.class_names != sorted(splits.class_names):
        splits = splits.reordered(sorted(splits.class_names))
    elif config.class_order == "domains" and config.dataset != "clinc150":
        raise DatasetError(
            f"class_order 'domains' is CLINC150's; dataset {config.dataset!r} takes 'natural' or 'alphabetical'"
        )
    splits = splits.limited(config.num_classes, config.train_per_class, config.test_per_class)
    every = config.section(DataSettings).validation
    if every:  # tuning: held-out training samples stand in for the test split
        splits = splits.validation(every)
    counts = np.bincount(splits.train_y, minlength=splits.num_classes)
    empty = [splits.class_names[c] for c in np.flatnonzero(counts == 0)]
    if empty:
        raise DatasetError(
            f"dataset {config.dataset!r}: classes without training samples: {empty[:5]} "
            f"({len(empty)} of {splits.num_classes}); every class needs at least one"
        )
    return splits
