"""The dataset every loader returns, ``Splits``: train and test samples with integer labels ``0..num_classes-1``
in the dataset's class order, and how it is renumbered, cut and held out; and ``DatasetError``, what every loader
raises for a dataset it cannot read as configured. The loaders (``client.text_datasets``,
``client.image_datasets``) build it, ``client.datasets.load_dataset`` orders and cuts it for a run.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np

from client.images import ImageTransforms


class DatasetError(ValueError):
    """A dataset that cannot be read as configured (a missing setting, a malformed file, classes that
    do not fit): the command-line programs print its message, without a traceback."""


@dataclass
class Splits:
    train_x: list[Any]
    train_y: np.ndarray  # (n_train,) int64
    test_x: list[Any]
    test_y: np.ndarray  # (n_test,) int64
    class_names: list[str]
    kind: str = "text"  # "text": samples are strings; "image": file paths or uint8 (H, W, 3) arrays
    transforms: ImageTransforms | None = None  # images only: the dataset's train / test transforms

    def __post_init__(self) -> None:
        if self.kind not in ("text", "image"):
            raise DatasetError(f"Splits.kind must be 'text' or 'image', got {self.kind!r}")
        if (self.kind == "image") != (self.transforms is not None):
            raise DatasetError("image splits need transforms, and text splits take none")

    @property
    def num_classes(self) -> int:
        return len(self.class_names)

    def reordered(self, names: list[str]) -> Splits:
        """The same samples with class ids renumbered so that class ``names[i]`` is id ``i``."""
        if sorted(names) != sorted(self.class_names):
            raise DatasetError(
                f"reordering needs the same class names, got {names[:5]}... for {self.class_names[:5]}..."
            )
        new_id = np.array([names.index(name) for name in self.class_names], dtype=np.int64)
        return dataclasses.replace(
            self, train_y=new_id[self.train_y], test_y=new_id[self.test_y], class_names=list(names)
        )

    def validation(self, every: int) -> Splits:
        """Training samples only: the ``0th, kth, 2kth, ...`` training sample of each class (``k = every``, in
        the split's order) become the test split, the others the training split; the test split is dropped."""
        held = np.zeros(len(self.train_y), dtype=bool)
        for c in range(self.num_classes):
            held[np.flatnonzero(self.train_y == c)[::every]] = True
        keep, out = np.flatnonzero(~held), np.flatnonzero(held)
        return dataclasses.replace(
            self,
            train_x=[self.train_x[i] for i in keep],
            train_y=self.train_y[keep],
            test_x=[self.train_x[i] for i in out],
            test_y=self.train_y[out],
        )

    def limited(self, num_classes: int, train_per_class: int, test_per_class: int) -> Splits:
        """The first ``num_classes`` classes, at most ``*_per_class`` samples of each (0: no cap)."""
        keep = num_classes or self.num_classes
        if keep > self.num_classes:
            raise DatasetError(f"asked for {keep} classes, the dataset has {self.num_classes}")

        def pick(y: np.ndarray, cap: int) -> np.ndarray:
            idx = [np.flatnonzero(y == c)[: cap or None] for c in range(keep)]
            return np.sort(np.concatenate(idx))

        tr, te = pick(self.train_y, train_per_class), pick(self.test_y, test_per_class)
        return dataclasses.replace(
            self,
            train_x=[self.train_x[i] for i in tr],
            train_y=self.train_y[tr],
            test_x=[self.test_x[i] for i in te],
            test_y=self.test_y[te],
            class_names=self.class_names[:keep],
        )
