"""The text datasets: the synthetic one of the tests, CLINC150 (fetched from its pinned public source when
missing) and bring-your-own files (``textfile``, read by ``client.text_rows``). Each is a function
``RunConfig -> Splits`` registered in ``client.datasets.DATASETS``; paths and checks come from
``client.dataset_files``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np

from client.dataset_files import class_index, data_dir, lookup, need_file, resolve
from client.splits import DatasetError, Splits
from client.text_rows import text_rows
from common.run.config import RunConfig
from common.run.settings import DataSettings


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


def textfile(config: RunConfig) -> Splits:
    """Bring-your-own text: the settings ``data.train_file`` and ``data.test_file``, CSV or JSONL.

    Class order: ``data.classes`` when given, else the order in which labels first
    appear in the training file. Relative paths are taken under ``data_dir(config)``.
    """
    paths = {}
    for key in ("train_file", "test_file"):
        paths[key] = need_file(
            resolve(config, key), f"a .csv (columns text,label) or .jsonl file (the setting data.{key})"
        )
    label_column = config.section(DataSettings).label_column
    train, test = text_rows(paths["train_file"], label_column), text_rows(paths["test_file"], label_column)
    given = config.section(DataSettings).classes
    names = list(given) if given else list(dict.fromkeys(label for _, label in train))
    index = class_index(names, "the setting data.classes")
    train_y = lookup((label for _, label in train), index, str(paths["train_file"]))
    test_y = lookup((label for _, label in test), index, str(paths["test_file"]))
    return Splits([text for text, _ in train], train_y, [text for text, _ in test], test_y, names)
