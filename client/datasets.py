"""Datasets as raw samples with integer labels ``0..num_classes-1`` in the dataset's class order.

A dataset is loaded on each client from local disk (or generated, for tests); nothing about
it crosses the wire. Tasks are contiguous label ranges (``common.run.partition.task_ranges``).
Every on-disk dataset lives in ``data_dir(config) / <name>``; text samples are strings,
image samples file paths or ``uint8 (H, W, 3)`` arrays (``client.images``). Datasets without
an official test split get a fixed 80/20 split per class (``holdout_split``) that does not
depend on the run seed, so every client and every run agree on it.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import json
import os
import re
import zlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import numpy as np

from client.images import ImageTransforms, image_size, image_transforms, is_image_file
from common.run.config import RunConfig
from common.run.settings import DataSettings


class DatasetError(ValueError):
    """A dataset that cannot be read as configured (a missing setting, a malformed file, classes that
    do not fit): the command-line programs print its message, without a traceback."""


HOLDOUT_SEED = 0  # fixed, not config.seed: the train/test split must not change with the run seed
HOLDOUT_TEST_FRACTION = 0.2  # ImageNet-R, ImageNet-A and EuroSAT: 80/20 per class


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


# --------------------------------------------------------------------------- helpers


def _dataset_root(config: RunConfig, name: str) -> tuple[Path, str]:
    """``data_dir / name`` and the hint that goes into every missing-path error of this dataset."""
    parent = data_dir(config)
    return parent / name, (
        f"data_dir / LORM_DATA_DIR (now {str(parent)!r}) must point at the folder that holds {name}/"
    )


def _need_dir(path: Path, contents: str, hint: str = "") -> Path:
    if not path.is_dir():
        raise FileNotFoundError(f"directory {path} not found: it should contain {contents}" + (hint and f"; {hint}"))
    return path


def _need_file(path: Path, contents: str, hint: str = "") -> Path:
    if not path.is_file():
        raise FileNotFoundError(f"file {path} not found: it should be {contents}" + (hint and f"; {hint}"))
    return path


def _resolve(config: RunConfig, key: str) -> Path:
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


def _class_index(names: list[str], where: str) -> dict[str, int]:
    index = {name: i for i, name in enumerate(names)}
    if len(index) != len(names):
        repeated = sorted({n for n in names if names.count(n) > 1})
        raise DatasetError(f"{where}: class names repeat: {repeated[:5]}")
    return index


Label = TypeVar("Label", str, int)  # a class name, or a numeric label of a .mat file


def _lookup(labels: Iterable[Label], index: dict[Label, int], where: str) -> np.ndarray:
    labels = list(labels)
    unknown = sorted({label for label in labels if label not in index}, key=str)
    if unknown:
        more = f" and {len(unknown) - 5} more" if len(unknown) > 5 else ""
        raise DatasetError(
            f"{where}: unknown labels {unknown[:5]}{more} (not among the {len(index)} classes, e.g. {list(index)[:5]})"
        )
    return np.array([index[label] for label in labels], dtype=np.int64)


def image_files(folder: Path) -> list[str]:
    return [str(p) for p in sorted(folder.iterdir()) if is_image_file(p)] if folder.is_dir() else []


def class_folders(root: Path) -> list[str]:
    return sorted(p.name for p in root.iterdir() if p.is_dir() and not p.name.startswith("."))


def holdout_split(files: list[list[str]], names: list[str]) -> tuple[list[str], np.ndarray, list[str], np.ndarray]:
    """A fixed 80/20 train/test split of each class's files (for datasets without an official one).

    Class ``c``'s files (sorted) are permuted by ``default_rng([HOLDOUT_SEED, crc32(name)])``;
    the first ``round(0.2 n)`` (at most ``n - 1``) are its test samples. Seeding by the class
    name keeps a class's split unchanged when other classes are added or removed.
    """
    train_x: list[str] = []
    test_x: list[str] = []
    train_y: list[int] = []
    test_y: list[int] = []
    for c, (paths, name) in enumerate(zip(files, names)):
        n = len(paths)
        order = np.random.default_rng([HOLDOUT_SEED, zlib.crc32(name.encode())]).permutation(n)
        n_test = min(int(round(HOLDOUT_TEST_FRACTION * n)), max(n - 1, 0))
        test = set(order[:n_test].tolist())
        for i, path in enumerate(paths):
            (test_x if i in test else train_x).append(path)
            (test_y if i in test else train_y).append(c)
    return train_x, np.array(train_y, dtype=np.int64), test_x, np.array(test_y, dtype=np.int64)


def _images(
    config: RunConfig,
    name: str,
    train: tuple[list, np.ndarray],
    test: tuple[list, np.ndarray],
    class_names: list[str],
    transforms: str | None = None,
) -> Splits:
    size = image_size(config.section(DataSettings))
    return Splits(
        train[0],
        train[1],
        test[0],
        test[1],
        class_names,
        kind="image",
        transforms=image_transforms(transforms or name, size),
    )


# --------------------------------------------------------------------------- text


def synthetic_text(config: RunConfig) -> Splits:
    """Class-structured token sequences: each class has its own signature words among shared noise.

    Sizes from the settings ``data.synthetic_classes`` (default 12), ``data.synthetic_train`` and
    ``data.synthetic_test`` samples per class (default 60 and 20). Seeded by ``config.model_seed``.
    """
    data = config.section(DataSettings)
    num_classes, n_train, n_test = data.synthetic_classes, data.synthetic_train, data.synthetic_test
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


CLINC150_SOURCE = "https://raw.githubusercontent.com/clinc/oos-eval/828f8093932c8fe6ca7936c3d2e52903b1c523de/data/"
CLINC150_SHA256 = {"data_full.json": "36923c3705a59e08fe9c3883d8bc2dd966ef93e22cb78ac41171782a698d56e0"}


def _download_clinc150(path: Path) -> None:
    """Fetch a missing CLINC150 file from its public source (pinned commit, checksum verified).

    Offline (``LORM_OFFLINE=1`` or ``HF_HUB_OFFLINE=1``) or on any network error it raises
    ``FileNotFoundError`` saying where the file was expected and where it comes from.
    """
    import hashlib
    import urllib.request

    url = CLINC150_SOURCE + path.name
    hint = (
        f"CLINC150 file {path} not found; it is {url} (data/{path.name} of github.com/clinc/oos-eval, "
        "commit 828f809); put it there or point LORM_DATA_DIR at the folder holding clinc150/"
    )
    if os.environ.get("LORM_OFFLINE") == "1" or os.environ.get("HF_HUB_OFFLINE") == "1":
        raise FileNotFoundError(hint + " (offline: no download attempted)")
    try:
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
    except OSError as exc:
        raise FileNotFoundError(f"{hint} (download failed: {exc})") from exc
    want = CLINC150_SHA256.get(path.name)
    if want and hashlib.sha256(data).hexdigest() != want:
        raise FileNotFoundError(f"{hint} (downloaded file's sha256 does not match {want})")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_bytes(data)
    tmp.replace(path)


def clinc150(config: RunConfig) -> Splits:
    """CLINC150 (OOS) in-scope intents from ``<data_dir>/clinc150/data_full.json``.

    Class order (``config.class_order``): ``alphabetical`` (the default) numbers the intents by
    sorted name, as the paper's code does (``sorted(set(labels))``), so each of the 5 tasks of 30
    classes mixes many domains; ``domains`` takes the domains of ``domains.json`` in file order,
    15 intents each, so each task is two whole domains (a harder split). Out-of-scope samples are
    not used. With the setting ``data.train_val`` the ``val`` split (20 per intent) follows the
    ``train`` split (100 per intent) in the training set.
    """
    root = data_dir(config) / "clinc150"
    full, domains = root / "data_full.json", root / "domains.json"
    needed = (full, domains) if config.class_order == "domains" else (full,)
    for path in needed:
        if not path.is_file():
            _download_clinc150(path)
    data = json.loads(full.read_text())
    if config.class_order == "domains":
        names = [intent for intents in json.loads(domains.read_text()).values() for intent in intents]
    elif config.class_order == "alphabetical":
        names = sorted({intent for _, intent in data["train"]})
    else:
        raise DatasetError(
            f"CLINC150 takes class_order 'alphabetical' (the paper's) or 'domains', got {config.class_order!r}"
        )
    index = {name: i for i, name in enumerate(names)}

    def split(rows: list[list[str]], what: str) -> tuple[list[str], np.ndarray]:
        unknown = sorted({intent for _, intent in rows if intent not in index})
        if unknown:
            source = "domains.json" if config.class_order == "domains" else "the training split"
            raise DatasetError(f"CLINC150 {what}: intents not in {source}: {unknown[:5]}")
        return [text for text, _ in rows], np.array([index[intent] for _, intent in rows], dtype=np.int64)

    train_rows = data["train"] + data["val"] if config.section(DataSettings).train_val else data["train"]
    train_x, train_y = split(train_rows, "train")
    test_x, test_y = split(data["test"], "test")
    return Splits(train_x, train_y, test_x, test_y, names)


LABEL_NAMES = ("label", "intent", "category")  # the label's column (CSV) or key (JSONL), first found


def _label_name(found: list[str], chosen: str, where: str) -> str:
    if chosen:
        if chosen not in found:
            raise DatasetError(f"{where}: the setting data.label_column = {chosen!r} is not among {found}")
        return chosen
    name = next((n for n in LABEL_NAMES if n in found), None)
    if name is None:
        raise DatasetError(
            f"{where}: no label column: expected one of {list(LABEL_NAMES)} (or set data.label_column), got {found}"
        )
    return name


CSV_DELIMITERS = (",", ";", "\t")  # the delimiters a CSV header may use, in the order tried


def _decoded(path: Path) -> str:
    """The whole file as text, UTF-8 with or without a byte-order mark (spreadsheets write one)."""
    data = path.read_bytes()
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = data[: exc.start].count(b"\n") + 1
        raise DatasetError(
            f"{path} line {line}: not UTF-8 ({exc.reason} at byte {exc.start}); save the file as UTF-8 "
            '(in a spreadsheet: "CSV UTF-8")'
        ) from exc


def _sample(where: str, text: object, label: object) -> tuple[str, str]:
    """``(text, label)`` of one row, or an error: a row without a text or a label is no sample, and leaving
    it out would drop data without a word."""
    if not isinstance(text, str):
        raise DatasetError(f"{where}: the text must be a string, got {json.dumps(text)}")
    if isinstance(label, bool) or not isinstance(label, (str, int)):
        raise DatasetError(f"{where}: the label must be a string or an integer, got {json.dumps(label)}")
    if not text.strip():
        raise DatasetError(f"{where}: empty text")
    if not str(label).strip():
        raise DatasetError(f"{where}: empty label")
    return text, str(label)


def _csv_delimiter(text: str, suffix: str) -> str:
    """The delimiter under which the header (the first non-blank line) names a ``text`` column.

    Only the delimiter is looked for; the quoting is RFC 4180's in every file. A dialect sniffed from a
    sample of rows decides ``doublequote`` by the rows that happen to fall in the sample, and with the wrong
    answer every ``""`` inside a quoted field splits it. Without a ``text`` column under any delimiter:
    tab for ``.tsv``, else the one that splits the header most (the error then names those columns).
    """
    header = next((line for line in io.StringIO(text, newline="") if line.strip()), "")
    columns: dict[str, list[str]] = {}
    for delimiter in CSV_DELIMITERS:
        try:
            columns[delimiter] = next(csv.reader([header], csv.excel, delimiter=delimiter, strict=True), [])
        except csv.Error:
            continue
    naming = [d for d in columns if "text" in columns[d]]
    if naming:
        return max(naming, key=lambda d: len(columns[d]))
    if suffix == ".tsv":
        return "\t"
    return max(columns, key=lambda d: len(columns[d]), default=",")


def _csv_error(exc: csv.Error) -> str:
    """What the csv module's error means in a file that is otherwise readable."""
    message = str(exc)
    if "unexpected end of data" in message:
        return f"a quote opened in the row that starts here never closes ({message})"
    if "field larger than field limit" in message:
        return f"a field of over {csv.field_size_limit()} characters starts here: most likely a quote that never closes"
    if "expected after" in message:
        return (
            f'text after a closing quote ({message}): a field that starts with " ends with it, '
            'and a " inside it is written ""'
        )
    return message


def _csv_records(path: Path, text: str, delimiter: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, fields)`` of every record, ``line`` the one it starts on (a quoted field may hold line breaks).

    Blank lines, and rows whose every field is empty (spreadsheets save formatted empty rows so), are no
    records. ``strict``: a quote that never closes, or text after a closing one, is an error here instead of
    a field that silently swallows the rows after it.
    """
    reader = csv.reader(io.StringIO(text, newline=""), csv.excel, delimiter=delimiter, strict=True)
    while True:
        start = reader.line_num + 1
        try:
            fields = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise DatasetError(f"{path} line {start}: {_csv_error(exc)}") from exc
        if any(field.strip() for field in fields):
            yield start, fields


def _csv_rows(path: Path, text: str, label_column: str) -> list[tuple[str, str]]:
    delimiter = _csv_delimiter(text, path.suffix.lower())
    records = _csv_records(path, text, delimiter)
    header = next(records, (0, []))[1]
    if "text" not in header:
        raise DatasetError(f"{path}: a CSV file needs a text column, got {header}")
    label = _label_name(header, label_column, str(path))
    text_at, label_at = header.index("text"), header.index(label)
    rows = []
    for line, fields in records:
        if len(fields) != len(header):
            raise DatasetError(
                f"{path} line {line}: {len(fields)} field{'s' if len(fields) != 1 else ''}, expected "
                f"{len(header)} ({', '.join(header)}); a field that holds {delimiter!r}, a quote or a line "
                'break must be quoted ("..."), with each " inside it written ""'
            )
        rows.append(_sample(f"{path} line {line}", fields[text_at], fields[label_at]))
    return rows


def _jsonl_rows(path: Path, text: str, label_column: str) -> list[tuple[str, str]]:
    rows = []
    # Lines end at \n only: a JSON string may hold U+2028 and other characters that str.splitlines breaks at.
    for number, line in enumerate(text.split("\n"), start=1):
        if not line.strip():
            continue
        where = f"{path} line {number}"
        try:
            item = json.loads(line)
        except json.JSONDecodeError as exc:
            raise DatasetError(f"{where}: not JSON ({exc.msg}): {line[:80]!r}") from exc
        if not isinstance(item, dict):
            raise DatasetError(f"{where}: expected a JSON object with text and label, got {line[:80]!r}")
        label = _label_name(list(item), label_column, where)
        if "text" not in item:
            raise DatasetError(f"{where}: no text key, got keys {list(item)}")
        rows.append(_sample(where, item["text"], item[label]))
    return rows


def text_rows(path: Path, label_column: str = "") -> list[tuple[str, str]]:
    """``(text, label)`` rows of a CSV or JSONL file, UTF-8 with or without a byte-order mark, in file order.

    CSV (``.csv``, ``.tsv``): a header with ``text`` and a label column (``label``, ``intent`` or
    ``category``, or ``label_column``), other columns ignored; the delimiter (comma, semicolon or tab) is the
    one under which the header names ``text``; quoting is RFC 4180's, as Python's csv module, pandas and
    spreadsheets write it (``"`` around a field that holds a delimiter, a quote or a line break, ``""`` for a
    quote inside it). JSONL (``.jsonl``, ``.ndjson``): one object a line with the same keys. A row that
    cannot be read (a wrong number of fields, a quote that never closes, an empty text or label) is a
    ``DatasetError`` naming the file and the line it starts on; blank lines are skipped.
    """
    suffix = path.suffix.lower()
    if suffix in (".csv", ".tsv"):
        return _csv_rows(path, _decoded(path), label_column)
    if suffix in (".jsonl", ".ndjson"):
        return _jsonl_rows(path, _decoded(path), label_column)
    raise DatasetError(f'{path}: expected a .csv (columns text,label) or .jsonl file ({{"text": .., "label": ..}})')


def textfile(config: RunConfig) -> Splits:
    """Bring-your-own text: the settings ``data.train_file`` and ``data.test_file``, CSV or JSONL.

    Class order: ``data.classes`` when given, else the order in which labels first
    appear in the training file. Relative paths are taken under ``data_dir(config)``.
    """
    paths = {}
    for key in ("train_file", "test_file"):
        paths[key] = _need_file(
            _resolve(config, key), f"a .csv (columns text,label) or .jsonl file (the setting data.{key})"
        )
    label_column = config.section(DataSettings).label_column
    train, test = text_rows(paths["train_file"], label_column), text_rows(paths["test_file"], label_column)
    given = config.section(DataSettings).classes
    names = list(given) if given else list(dict.fromkeys(label for _, label in train))
    index = _class_index(names, "the setting data.classes")
    train_y = _lookup((label for _, label in train), index, str(paths["train_file"]))
    test_y = _lookup((label for _, label in test), index, str(paths["test_file"]))
    return Splits([text for text, _ in train], train_y, [text for text, _ in test], test_y, names)


# --------------------------------------------------------------------------- images


def cifar100(config: RunConfig) -> Splits:
    """CIFAR-100 from the official binary version, ``cifar100/cifar-100-binary/{train,test}.bin``.

    Each record is 3074 bytes: coarse label, fine label, then 32 x 32 red, green and blue
    planes. Classes are the 100 fine labels in their natural order (names from
    ``fine_label_names.txt`` when present). The whole set stays in memory as ``uint8``.
    """
    root, hint = _dataset_root(config, "cifar100")
    folder = _need_dir(
        root / "cifar-100-binary",
        "train.bin and test.bin of the CIFAR-100 binary version (cifar-100-binary.tar.gz, extracted into cifar100/)",
        hint,
    )

    def read(split: str) -> tuple[list[np.ndarray], np.ndarray]:
        path = _need_file(folder / f"{split}.bin", f"the CIFAR-100 binary {split} records", hint)
        raw = np.fromfile(path, dtype=np.uint8)
        if raw.size == 0 or raw.size % 3074:
            raise DatasetError(
                f"{path}: {raw.size} bytes is not a whole number of 3074-byte records "
                "(coarse label, fine label, 3072 pixel bytes)"
            )
        records = raw.reshape(-1, 3074)
        labels = records[:, 1].astype(np.int64)
        if labels.max() >= 100:
            raise DatasetError(
                f"{path}: unknown fine labels {sorted(set(labels[labels >= 100].tolist()))[:5]} (CIFAR-100 has 0..99)"
            )
        pixels = np.ascontiguousarray(records[:, 2:].reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1))
        return list(pixels), labels  # (32, 32, 3) uint8 views of one array

    names_file = folder / "fine_label_names.txt"
    names = [str(c) for c in range(100)]
    if names_file.is_file():
        names = [line.strip() for line in names_file.read_text().splitlines() if line.strip()]
        if len(names) != 100:
            raise DatasetError(f"{names_file}: expected 100 class names, one a line, got {len(names)}")
    return _images(config, "cifar100", read("train"), read("test"), names)


def _folder_per_class(config: RunConfig, name: str, subdir: str, contents: str) -> Splits:
    """One folder of images per class under ``name/subdir``, classes sorted, ``holdout_split``."""
    root, hint = _dataset_root(config, name)
    folder = _need_dir(root / subdir if subdir else root, contents, hint)
    names = class_folders(folder)
    if not names:
        raise FileNotFoundError(f"{folder} holds no class folders: it should contain {contents}")
    train_x, train_y, test_x, test_y = holdout_split([image_files(folder / c) for c in names], names)
    return _images(config, name, (train_x, train_y), (test_x, test_y), names)


def imagenet_r(config: RunConfig) -> Splits:
    """ImageNet-R, ``imagenet-r/<wnid>/*.jpg`` (200 classes sorted by WordNet id), 80/20 holdout."""
    return _folder_per_class(
        config, "imagenet-r", "", "one folder of images per class named by WordNet id (imagenet-r.tar extracted)"
    )


def imagenet_a(config: RunConfig) -> Splits:
    """ImageNet-A, ``imagenet-a/<wnid>/*.jpg`` (200 classes sorted by WordNet id), 80/20 holdout."""
    return _folder_per_class(
        config, "imagenet-a", "", "one folder of images per class named by WordNet id (imagenet-a.tar extracted)"
    )


def eurosat(config: RunConfig) -> Splits:
    """EuroSAT RGB, ``eurosat/2750/<ClassName>/*.jpg`` (10 classes sorted by name), 80/20 holdout.

    The paper states no split; this is our fixed ``holdout_split``.
    """
    return _folder_per_class(
        config,
        "eurosat",
        "2750",
        "one folder of .jpg images per class (EuroSAT_RGB.zip: 2750/AnnualCrop, 2750/Forest, ...)",
    )


def cars196(config: RunConfig) -> Splits:
    """Stanford Cars: ``cars196/devkit/{cars_meta,cars_train_annos,cars_test_annos_withlabels}.mat``.

    Images in ``cars196/cars_train/`` and ``cars196/cars_test/`` (uncropped); the 196 classes
    in the order of ``cars_meta.mat`` (the .mat labels are 1-based).
    """
    from scipy.io import loadmat

    root, hint = _dataset_root(config, "cars196")
    devkit = _need_dir(
        root / "devkit",
        "cars_meta.mat, cars_train_annos.mat and "
        "cars_test_annos_withlabels.mat (car_devkit.tgz plus the labelled test annotations)",
        hint,
    )
    meta = _need_file(devkit / "cars_meta.mat", "the Stanford Cars devkit class list (class_names)", hint)
    names = [str(n) for n in np.atleast_1d(loadmat(meta, squeeze_me=True)["class_names"])]
    index = {c + 1: c for c in range(len(names))}  # .mat labels are 1-based

    def read(split: str, annos: str) -> tuple[list[str], np.ndarray]:
        path = _need_file(devkit / annos, f"the Stanford Cars {split} annotations (fname, class)", hint)
        images = _need_dir(root / f"cars_{split}", f"the Stanford Cars {split} images (cars_{split}.tgz)", hint)
        table = np.atleast_1d(loadmat(path, squeeze_me=True)["annotations"])
        labels = _lookup((int(c) for c in table["class"]), index, f"{path} (1-based class)")
        return [str(images / str(f)) for f in table["fname"]], labels

    train = read("train", "cars_train_annos.mat")
    test = read("test", "cars_test_annos_withlabels.mat")
    return _images(config, "cars196", train, test, names)


def cub200(config: RunConfig) -> Splits:
    """CUB-200-2011, ``cub200/CUB_200_2011/`` with its official train/test split.

    Classes in ``classes.txt`` order (ids 1..200); names without the ``001.`` prefix.
    """
    root, hint = _dataset_root(config, "cub200")
    folder = _need_dir(
        root / "CUB_200_2011",
        "images.txt, image_class_labels.txt, train_test_split.txt, "
        "classes.txt and images/ (CUB_200_2011.tgz extracted)",
        hint,
    )

    def table(file: str, what: str) -> dict[str, str]:
        path = _need_file(folder / file, what, hint)
        rows = [line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip()]
        return {key: value.strip() for key, value in rows}

    images = table("images.txt", "lines '<image id> <relative path>'")
    labels = table("image_class_labels.txt", "lines '<image id> <class id>'")
    is_train = table("train_test_split.txt", "lines '<image id> <1 = train, 0 = test>'")
    classes = table("classes.txt", "lines '<class id> <nnn.Class_name>'")
    index = _class_index(list(classes), str(folder / "classes.txt"))
    names = [re.sub(r"^\d+\.", "", name) for name in classes.values()]
    image_dir = _need_dir(folder / "images", "one folder of images per class", hint)
    ids = list(images)
    missing = [i for i in ids if i not in labels or i not in is_train]
    if missing:
        raise DatasetError(f"{folder}: image ids {missing[:5]} have no class or no train/test flag")
    y = _lookup((labels[i] for i in ids), index, str(folder / "image_class_labels.txt"))
    train = np.array([is_train[i] == "1" for i in ids])
    paths = np.array([str(image_dir / images[i]) for i in ids], dtype=object)
    return _images(config, "cub200", (list(paths[train]), y[train]), (list(paths[~train]), y[~train]), names)


def imagefolder(config: RunConfig) -> Splits:
    """Bring-your-own images: the setting ``data.root`` with ``train/<class>/*`` and ``test/<class>/*``.

    Class order: ``data.classes`` when given, else the sorted ``train/`` folder names.
    Transforms: ``data.transforms`` names a dataset's (default: ImageNet-R's).
    """
    root = _resolve(config, "root")
    layout = "train/<class>/<images> and test/<class>/<images> (the setting data.root)"
    train_dir, test_dir = _need_dir(root / "train", layout), _need_dir(root / "test", layout)
    given = config.section(DataSettings).classes
    names = list(given) if given else class_folders(train_dir)
    index = _class_index(names, "the setting data.classes")

    def read(folder: Path) -> tuple[list[str], np.ndarray]:
        found = class_folders(folder)
        _lookup(found, index, f"{folder} (class folders)")
        paths = [image_files(folder / c) for c in names]
        return [p for ps in paths for p in ps], np.repeat(np.arange(len(names)), [len(ps) for ps in paths])

    transforms = config.section(DataSettings).transforms
    return _images(config, "imagefolder", read(train_dir), read(test_dir), names, transforms)


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
