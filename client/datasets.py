"""Datasets as raw samples with integer labels ``0..num_classes-1`` in the dataset's class order.

A dataset is loaded on each client from local disk (or generated, for tests); nothing about
it crosses the wire. Tasks are contiguous label ranges (``common.partition.task_ranges``).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import numpy as np

from common.config import RunConfig


@dataclass
class Splits:
    train_x: list[Any]
    train_y: np.ndarray  # (n_train,) int64
    test_x: list[Any]
    test_y: np.ndarray  # (n_test,) int64
    class_names: list[str]

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def limited(self, num_classes: int, train_per_class: int, test_per_class: int) -> "Splits":
        """The first ``num_classes`` classes, at most ``*_per_class`` samples of each (0: no cap)."""
        keep = num_classes or self.num_classes
        if keep > self.num_classes:
            raise ValueError(f"asked for {keep} classes, the dataset has {self.num_classes}")

        def pick(y: np.ndarray, cap: int) -> np.ndarray:
            idx = [np.flatnonzero(y == c)[: cap or None] for c in range(keep)]
            return np.sort(np.concatenate(idx))

        tr, te = pick(self.train_y, train_per_class), pick(self.test_y, test_per_class)
        return Splits([self.train_x[i] for i in tr], self.train_y[tr], [self.test_x[i] for i in te],
                      self.test_y[te], self.class_names[:keep])


def data_dir(config: RunConfig) -> Path:
    """``config.data_dir``, else ``$LORM_DATA_DIR``; raises with what to set when neither is."""
    root = config.data_dir or os.environ.get("LORM_DATA_DIR", "")
    if not root:
        raise FileNotFoundError(
            f"dataset {config.dataset!r} needs a data directory: set data_dir in the run configuration "
            "or the environment variable LORM_DATA_DIR (e.g. LORM_DATA_DIR=../shared/datasets)")
    return Path(root).expanduser()


def synthetic_text(config: RunConfig) -> Splits:
    """Class-structured token sequences: each class has its own signature words among shared noise.

    Sizes from ``config.extra``: ``synthetic_classes`` (default 12), ``synthetic_train`` and
    ``synthetic_test`` samples per class (default 60 and 20). Seeded by ``config.model_seed``.
    """
    num_classes = int(config.extra.get("synthetic_classes", 12))
    n_train = int(config.extra.get("synthetic_train", 60))
    n_test = int(config.extra.get("synthetic_test", 20))
    rng = np.random.default_rng([config.model_seed, 7])
    noise = [f"n{k}" for k in range(40)]
    signature = [[f"c{c}w{k}" for k in range(6)] for c in range(num_classes)]

    def sample(c: int) -> str:
        words = list(rng.choice(signature[c], size=4)) + list(rng.choice(noise, size=4))
        rng.shuffle(words)
        return " ".join(words)

    def split(n: int) -> tuple[list[str], np.ndarray]:
        y = np.repeat(np.arange(num_classes), n)
        return [sample(int(c)) for c in y], y.astype(np.int64)

    train_x, train_y = split(n_train)
    test_x, test_y = split(n_test)
    return Splits(train_x, train_y, test_x, test_y, [f"class{c}" for c in range(num_classes)])


def clinc150(config: RunConfig) -> Splits:
    """CLINC150 (OOS) in-scope intents from ``<data_dir>/clinc150/data_full.json``.

    Class order: the domains of ``domains.json`` in file order, 15 intents each, so that the
    paper's 5 tasks of 30 classes are pairs of domains. Out-of-scope samples are not used.
    """
    root = data_dir(config) / "clinc150"
    full, domains = root / "data_full.json", root / "domains.json"
    for path in (full, domains):
        if not path.is_file():
            raise FileNotFoundError(
                f"CLINC150 file {path} not found; it is data/data_full.json of github.com/clinc/oos-eval "
                "(commit 828f809) plus domains.json; point LORM_DATA_DIR at the folder holding clinc150/")
    data = json.loads(full.read_text())
    names = [intent for intents in json.loads(domains.read_text()).values() for intent in intents]
    index = {name: i for i, name in enumerate(names)}

    def split(rows: list[list[str]], what: str) -> tuple[list[str], np.ndarray]:
        unknown = sorted({intent for _, intent in rows if intent not in index})
        if unknown:
            raise ValueError(f"CLINC150 {what}: intents not in domains.json: {unknown[:5]}")
        return [text for text, _ in rows], np.array([index[intent] for _, intent in rows], dtype=np.int64)

    train_x, train_y = split(data["train"], "train")
    test_x, test_y = split(data["test"], "test")
    return Splits(train_x, train_y, test_x, test_y, names)


DATASETS: dict[str, Callable[[RunConfig], Splits]] = {
    "synthetic-text": synthetic_text,
    "clinc150": clinc150,
}


def load_dataset(config: RunConfig) -> Splits:
    if config.dataset not in DATASETS:
        raise ValueError(f"unknown dataset {config.dataset!r}; known: {sorted(DATASETS)}")
    splits = DATASETS[config.dataset](config)
    return splits.limited(config.num_classes, config.train_per_class, config.test_per_class)
