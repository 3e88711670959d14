"""Finished tiny runs, for the tests of their exports (lorm-predict, lorm-serve): real in-process runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path

from common.run.config import RunConfig
from engine.simulation import run_inprocess

ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = ROOT / "tests" / "data" / "own-text"
CLASSES = ["alarm", "balance", "greeting", "music", "timer", "weather"]  # the files' own order, named


def own_text_config(**changes: object) -> RunConfig:
    """LoRM on tiny-bert over tests/data/own-text: 6 classes in 3 tasks, 3 clients, seconds on one thread."""
    settings = {
        "data": {
            "train_file": str(OWN_TEXT / "train.csv"),
            "test_file": str(OWN_TEXT / "test.csv"),
            "classes": CLASSES,
        }
    }
    base = dict(
        run_id="own-text",
        dataset="textfile",
        backbone="tiny-bert",
        num_tasks=3,
        num_clients=3,
        rounds_per_task=2,
        local_epochs=2,
        max_length=8,  # some test sentences are cut: the export must carry it
        threads=1,
        settings=settings,
    )
    return RunConfig(**{**base, **changes})  # type: ignore[arg-type]


def image_folder(root: Path, classes: list[str], per_split: dict[str, int]) -> dict[str, list[str]]:
    """Tiny PNGs ``root/<split>/<class>/<k>.png`` (20 x 20; the classes differ in tone); each split's paths."""
    import numpy as np
    from PIL import Image

    paths: dict[str, list[str]] = {}
    for split, n in per_split.items():
        for c, name in enumerate(classes):
            for k in range(n):
                rng = np.random.default_rng([c, k, split == "test"])
                pixels = (rng.integers(0, 64, (20, 20, 3)) + 48 * c).astype(np.uint8)
                path = root / split / name / f"{k}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(pixels).save(path)
                paths.setdefault(split, []).append(str(path))
    return paths


def image_config(root: Path, classes: list[str], **changes: object) -> RunConfig:
    """tiny-vit on :func:`image_folder`'s ``root`` (16 pixels): 2 tasks, 2 clients, a round of an epoch each."""
    settings = {"data": {"root": str(root), "classes": classes, "image_size": 16}}
    base = dict(
        dataset="imagefolder",
        backbone="tiny-vit",
        num_tasks=2,
        num_clients=2,
        min_client_samples=1,
        rounds_per_task=1,
        local_epochs=1,
    )
    extra = changes.pop("settings", {})
    assert isinstance(extra, dict)
    return own_text_config(**{**base, **changes, "settings": settings | extra})


def finished_run(results_dir: Path, **changes: object) -> Path:
    """Run :func:`own_text_config` (with ``changes``) to its end, exporting into ``results_dir``."""
    run_inprocess(own_text_config(**changes), results_dir=results_dir)
    return results_dir


def held_out_rows() -> list[tuple[str, str]]:
    with (OWN_TEXT / "test.csv").open() as f:
        return [(row["text"], row["label"]) for row in csv.DictReader(f)]


def counted(results_dir: Path) -> tuple[list[int], list[int]]:
    """The run's evaluation after its last task: correct and total test samples per task."""
    metrics = json.loads((results_dir / "metrics.json").read_text())
    return metrics["correct"][-1], metrics["total"][-1]


def per_task(labels: list[str], predicted: list[str], classes: list[str], tasks: list[list[int]]) -> list[int]:
    """Correct predictions per task, as the evaluation counts them (a sample's task is its true class's)."""
    correct = [0] * len(tasks)
    for label, guess in zip(labels, predicted):
        y = classes.index(label)
        task = next(t for t, (lo, hi) in enumerate(tasks) if lo <= y < hi)
        correct[task] += guess == label
    return correct
