"""Where a dataset's files are and the checks every loader makes of what it reads there: the data directory
(``data_dir``), a dataset's folder under it, a setting's path, a folder or file that must exist (each error names
what it should hold and where it was looked for), and class names and labels that must be known. The loaders of
``client.text_datasets`` and ``client.image_datasets`` share them.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path
from typing import TypeVar

import numpy as np

from client.splits import DatasetError
from common.run.config import RunConfig
from common.run.settings import DataSettings


def data_dir(config: RunConfig) -> Path:
    """``config.data_dir``, else ``$LORM_DATA_DIR``; raises with what to set when neither is."""
    root = config.data_dir or os.environ.get("LORM_DATA_DIR", "")
    if not root:
        raise FileNotFoundError(
            f"dataset {config.dataset!r} needs a data directory: set the environment variable LORM_DATA_DIR "
            "(e.g. LORM_DATA_DIR=../shared/datasets), lorm-client --data-dir, or data_dir in an in-process run's "
            "configuration"
        )
    return Path(root).expanduser()


def dataset_root(config: RunConfig, name: str) -> tuple[Path, str]:
    """``data_dir / name`` and the hint that goes into every missing-path error of this dataset."""
    parent = data_dir(config)
    return parent / name, (
        f"data_dir / LORM_DATA_DIR (now {str(parent)!r}) must point at the folder that holds {name}/"
    )


def need_dir(path: Path, contents: str, hint: str = "") -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"directory {path} not found: it should contain {contents}" + (hint and f"; {hint}"))
    return path


def need_file(path: Path, contents: str, hint: str = "") -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"file {path} not found: it should be {contents}" + (hint and f"; {hint}"))
    return path


def resolve(config: RunConfig, key: str) -> Path:
    """The setting ``data.<key>`` as a path: absolute as given; relative, under the working directory if it
    is there, else under ``data_dir(config)``. A path found nowhere is named with every place tried."""
    value = getattr(config.section(DataSettings), key)
    if not value:
        raise DatasetError(f"dataset {config.dataset!r} needs the setting data.{key} (--set data.{key}=...)")
    path = Path(value).expanduser()
    if path.is_absolute() or path.exists():
        return path
    root = config.data_dir or os.environ.get("LORM_DATA_DIR", "")
    if root and (Path(root).expanduser() / path).exists():
        return Path(root).expanduser() / path
    tried = [str(path.resolve())] + ([str(Path(root).expanduser() / path)] if root else [])
    raise FileNotFoundError(
        f"data.{key} = {value!r}: no such file or folder; tried {' and '.join(tried)}"
        + ("" if root else " (set data_dir or LORM_DATA_DIR to look there too)")
    )


def class_index(names: list[str], where: str) -> dict[str, int]:
    index = {name: i for i, name in enumerate(names)}
    if len(index) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise DatasetError(f"{where}: class names repeat: {repeated[:5]}")
    return index


Label = TypeVar("Label", str, int)  # a class name, or a numeric label of a .mat file


def lookup(labels: Iterable[Label], index: dict[Label, int], where: str) -> np.ndarray:
    labels = list(labels)
    unknown = sorted({label for label in labels if label not in index}, key=str)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise DatasetError(
            f"{where}: unknown labels {unknown[:5]}{more} (not among the {len(index)} classes, e.g. {list(index)[:5]})"
        )
    return np.array([index[label] for label in labels], dtype=np.int64)
