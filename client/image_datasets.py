"""The image datasets: CIFAR-100 (in memory), ImageNet-R, ImageNet-A, EuroSAT, Stanford Cars, CUB-200 and
bring-your-own folders (``imagefolder``), each a function ``RunConfig -> Splits`` registered in
``client.datasets.DATASETS``, with the dataset's transforms (``client.images``). Datasets without an official test
split get a fixed 80/20 split per class (``holdout_split``) that does not depend on the run seed, so every client
and every run agree on it. Paths and checks come from ``client.dataset_files``.
"""

from __future__ import annotations

import re
import zlib
from pathlib import Path

import numpy as np

from client.dataset_files import class_index, dataset_root, lookup, need_dir, need_file, resolve
from client.images import image_size, image_transforms, is_image_file
from client.splits import DatasetError, Splits
from common.run.config import RunConfig
from common.run.settings import DataSettings

HOLDOUT_SEED = 0  # fixed, not config.seed: the train/test split must not change with the run seed
HOLDOUT_TEST_FRACTION = 0.2  # ImageNet-R, ImageNet-A and EuroSAT: 80/20 per class


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


def cifar100(config: RunConfig) -> Splits:
    """CIFAR-100 from the official binary version, ``cifar100/cifar-100-binary/{train,test}.bin``.

    Each record is 3074 bytes: coarse label, fine label, then 32 x 32 red, green and blue
    planes. Classes are the 100 fine labels in their natural order (names from
    ``fine_label_names.txt`` when present). The whole set stays in memory as ``uint8``.
    """
    root, hint = dataset_root(config, "cifar100")
    folder = need_dir(
        root / "cifar-100-binary",
        "train.bin and test.bin of the CIFAR-100 binary version (cifar-100-binary.tar.gz, extracted into cifar100/)",
        hint,
    )

    def read(split: str) -> tuple[list[np.ndarray], np.ndarray]:
        path = need_file(folder / f"{split}.bin", f"the CIFAR-100 binary {split} records", hint)
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
    root, hint = dataset_root(config, name)
    folder = need_dir(root / subdir if subdir else root, contents, hint)
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

    root, hint = dataset_root(config, "cars196")
    devkit = need_dir(
        root / "devkit",
        "cars_meta.mat, cars_train_annos.mat and "
        "cars_test_annos_withlabels.mat (car_devkit.tgz plus the labelled test annotations)",
        hint,
    )
    meta = need_file(devkit / "cars_meta.mat", "the Stanford Cars devkit class list (class_names)", hint)
    names = [str(n) for n in np.atleast_1d(loadmat(meta, squeeze_me=True)["class_names"])]
    index = {c + 1: c for c in range(len(names))}  # .mat labels are 1-based

    def read(split: str, annos: str) -> tuple[list[str], np.ndarray]:
        path = need_file(devkit / annos, f"the Stanford Cars {split} annotations (fname, class)", hint)
        images = need_dir(root / f"cars_{split}", f"the Stanford Cars {split} images (cars_{split}.tgz)", hint)
        table = np.atleast_1d(loadmat(path, squeeze_me=True)["annotations"])
        labels = lookup((int(c) for c in table["class"]), index, f"{path} (1-based class)")
        return [str(images / str(f)) for f in table["fname"]], labels

    train = read("train", "cars_train_annos.mat")
    test = read("test", "cars_test_annos_withlabels.mat")
    return _images(config, "cars196", train, test, names)


def cub200(config: RunConfig) -> Splits:
    """CUB-200-2011, ``cub200/CUB_200_2011/`` with its official train/test split.

    Classes in ``classes.txt`` order (ids 1..200); names without the ``001.`` prefix.
    """
    root, hint = dataset_root(config, "cub200")
    folder = need_dir(
        root / "CUB_200_2011",
        "images.txt, image_class_labels.txt, train_test_split.txt, "
        "classes.txt and images/ (CUB_200_2011.tgz extracted)",
        hint,
    )

    def table(file: str, what: str) -> dict[str, str]:
        path = need_file(folder / file, what, hint)
        rows = [line.split(maxsplit=1) for line in path.read_text().splitlines() if line.strip()]
        return {key: value.strip() for key, value in rows}

    images = table("images.txt", "lines '<image id> <relative path>'")
    labels = table("image_class_labels.txt", "lines '<image id> <class id>'")
    is_train = table("train_test_split.txt", "lines '<image id> <1 = train, 0 = test>'")
    classes = table("classes.txt", "lines '<class id> <nnn.Class_name>'")
    index = class_index(list(classes), str(folder / "classes.txt"))
    names = [re.sub(r"^\d+\.", "", name) for name in classes.values()]
    image_dir = need_dir(folder / "images", "one folder of images per class", hint)
    ids = list(images)
    missing = [i for i in ids if i not in labels or i not in is_train]
    if missing:
        raise DatasetError(f"{folder}: image ids {missing[:5]} have no class or no train/test flag")
    y = lookup((labels[i] for i in ids), index, str(folder / "image_class_labels.txt"))
    train = np.array([is_train[i] == "1" for i in ids])
    paths = np.array([str(image_dir / images[i]) for i in ids], dtype=object)
    return _images(config, "cub200", (list(paths[train]), y[train]), (list(paths[~train]), y[~train]), names)


def imagefolder(config: RunConfig) -> Splits:
    """Bring-your-own images: the setting ``data.root`` with ``train/<class>/*`` and ``test/<class>/*``.

    Class order: ``data.classes`` when given, else the sorted ``train/`` folder names.
    Transforms: ``data.transforms`` names a dataset's (default: ImageNet-R's).
    """
    root = resolve(config, "root")
    layout = "train/<class>/<images> and test/<class>/<images> (the setting data.root)"
    train_dir, test_dir = need_dir(root / "train", layout), need_dir(root / "test", layout)
    given = config.section(DataSettings).classes
    names = list(given) if given else class_folders(train_dir)
    index = class_index(names, "the setting data.classes")

    def read(folder: Path) -> tuple[list[str], np.ndarray]:
        found = class_folders(folder)
        lookup(found, index, f"{folder} (class folders)")
        paths = [image_files(folder / c) for c in names]
        return [p for ps in paths for p in ps], np.repeat(np.arange(len(names)), [len(ps) for ps in paths])

    transforms = config.section(DataSettings).transforms
    return _images(config, "imagefolder", read(train_dir), read(test_dir), names, transforms)
