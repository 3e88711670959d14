"""``lorm-predict --eval FILE``: an export scored on a labelled file, counted as the run's evaluation counts.

The file is read as a client reads its own data (``lorm-client --data``, ``client/owned.py``): a CSV or JSONL file
of text and label (``client.text_rows.text_rows``: RFC 4180 quoting, so a sentence may hold commas, quotes and line
breaks; the ``text`` column and the first of ``label``, ``intent``, ``category``), or a folder of images in
class-named subfolders. A sample of class ``c`` counts in the task whose ``[lo, hi)`` holds ``c`` and is right
when the prediction, the argmax over the classes learned so far (``card.seen_classes``), is ``c``: on the run's
own test split the counts are those of its evaluation after the last task the export learned (``metrics.json``'s
``correct[-1]`` and ``total[-1]`` for the final export).

A label that is no class of the export, or a class of a task not learned yet, can never be predicted: such samples
are counted apart, by label, and are in no accuracy (neither a task's nor the overall one).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from client.image_datasets import class_folders, image_files
from client.splits import DatasetError
from client.text_rows import text_rows
from common.wire.model_card import ModelCard
from serve.model import Classifier

SHOWN_LABELS = 5  # labels named for the samples left out of the accuracy (the counts cover them all)


@dataclass(frozen=True)
class Labelled:
    """The samples of a labelled file, in file order (an image folder: class folders sorted, files sorted)."""

    path: Path
    kind: str  # "text": sentences; "image": image paths
    samples: list[str]
    labels: list[str]


def read_labelled(path: Path, label_column: str = "") -> Labelled:
    """``path`` as ``lorm-client --data`` reads it: a text file of rows with labels, or a folder of class folders.
    ``DatasetError`` names the file and the line a bad row starts on; a file without a sample is refused too."""
    if path.is_dir():
        samples: list[str] = []
        labels: list[str] = []
        for name in class_folders(path):
            files = image_files(path / name)
            samples += files
            labels += [name] * len(files)
        if not samples:
            raise DatasetError(f"{path}: no images in class folders (expected {path}/<class>/<image>)")
        return Labelled(path, "image", samples, labels)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such file or folder (a .csv or .jsonl of text and label, or a folder)")
    rows = text_rows(path, label_column)
    if not rows:
        raise DatasetError(f"{path}: no labelled rows")
    return Labelled(path, "text", [text for text, _ in rows], [label for _, label in rows])


@dataclass
class Evaluation:
    """The counts of one labelled file: per learned task, the wrong pairs, and the samples no prediction can get
    right (their labels unknown to the export, or classes of a task not learned yet)."""

    tasks: list[list[int]]  # the learned tasks' [lo, hi) class ranges
    correct: list[int]  # per learned task
    total: list[int]
    confusions: Counter[tuple[str, str]] = field(default_factory=Counter)  # (true, predicted) -> wrong samples
    unknown: Counter[str] = field(default_factory=Counter)  # label among no class of the export -> samples
    unlearned: Counter[str] = field(default_factory=Counter)  # class of a task not learned yet -> samples


def evaluate(model: Classifier, data: Labelled, batch_size: int = 32) -> Evaluation:
    """``model``'s predictions of ``data``, counted per learned task; samples that cannot be right counted apart."""
    card = model.card
    classes = card.classes or []  # the Classifier refused a card without them
    index = {name: i for i, name in enumerate(classes)}
    seen = card.seen_classes
    learned = card.tasks[: card.tasks_trained]
    out = Evaluation(learned, [0] * len(learned), [0] * len(learned))
    task_of = {c: t for t, (lo, hi) in enumerate(learned) for c in range(lo, hi)}
    scored: list[tuple[str, int]] = []  # (sample, class id) of the samples a prediction may get right
    for sample, label in zip(data.samples, data.labels):
        y = index.get(label)
        if y is None:
            out.unknown[label] += 1
        elif y >= seen:
            out.unlearned[label] += 1
        else:
            scored.append((sample, y))
    for start in range(0, len(scored), batch_size):
        chunk = scored[start : start + batch_size]
        for (_, y), p in zip(chunk, model.predict([sample for sample, _ in chunk])):
            t = task_of[y]
            out.total[t] += 1
            if p.index == y:
                out.correct[t] += 1
            else:
                out.confusions[(classes[y], p.label)] += 1
    return out


def _accuracy(correct: int, total: int) -> float | None:
    return 100.0 * correct / total if total else None


def _left_out(counts: Counter[str]) -> dict[str, Any]:
    shown = counts.most_common(SHOWN_LABELS)
    return {
        "samples": sum(counts.values()),
        "labels": len(counts),
        "examples": [{"label": k, "samples": n} for k, n in shown],
    }


def summary(ev: Evaluation, card: ModelCard, export: Path, data: Labelled, top: int) -> dict[str, Any]:
    """Every figure as one JSON-able object: accuracies in percent (None: no sample), as ``metrics.json``'s."""
    accuracies = [_accuracy(c, n) for c, n in zip(ev.correct, ev.total)]
    per_task = [
        {"task": t, "classes": list(lo_hi), "correct": c, "total": n, "accuracy": a}
        for t, (lo_hi, c, n, a) in enumerate(zip(ev.tasks, ev.correct, ev.total, accuracies))
    ]
    measured = [a for a in accuracies if a is not None]
    correct, total = sum(ev.correct), sum(ev.total)
    return {
        "export": str(export),
        "file": str(data.path),
        "method": card.method,
        "tasks_trained": card.tasks_trained,
        "num_tasks": len(card.tasks),
        "seen_classes": card.seen_classes,
        "num_classes": card.num_classes,
        "samples": len(data.samples),
        "tasks": per_task,
        "overall": {"correct": correct, "total": total, "accuracy": _accuracy(correct, total)},
        "mean_task_accuracy": sum(measured) / len(measured) if measured else None,  # FAA's definition
        "wrong": total - correct,
        "confusions": [{"true": a, "predicted": b, "samples": n} for (a, b), n in ev.confusions.most_common(top)],
        "confusion_pairs": len(ev.confusions),
        # samples no prediction can get right: in neither "tasks" nor "overall"
        "unknown_labels": _left_out(ev.unknown),
        "unlearned_classes": _left_out(ev.unlearned),
        "left_out_of_accuracy": sum(ev.unknown.values()) + sum(ev.unlearned.values()),
    }


def _percent(value: float | None) -> str:
    return "—" if value is None else f"{value:.2f}%"


def _examples(part: dict[str, Any]) -> str:
    named = ", ".join(f"{e['label']!r} ({e['samples']})" for e in part["examples"])
    more = part["labels"] - len(part["examples"])
    return named + (f" and {more} more" if more else "")


def format_text(figures: dict[str, Any]) -> str:
    """The summary as a plain-text report: a line per task, the overall line, what was left out, the errors."""
    lines = [
        f"{figures['export']} ({figures['method']}): {figures['tasks_trained']} of {figures['num_tasks']} tasks "
        f"learned, classes 0-{figures['seen_classes'] - 1} of {figures['num_classes']}",
        f"{figures['file']}: {figures['samples']} samples",
        f"{'task':<6}{'classes':<10}{'correct':>9}{'total':>8}{'accuracy':>10}",
    ]
    for row in figures["tasks"]:
        lo, hi = row["classes"]
        lines.append(
            f"{row['task']:<6}{f'{lo}-{hi - 1}':<10}{row['correct']:>9}{row['total']:>8}{_percent(row['accuracy']):>10}"
        )
    overall = figures["overall"]
    lines.append(f"{'all':<16}{overall['correct']:>9}{overall['total']:>8}{_percent(overall['accuracy']):>10}")
    lines.append(f"mean accuracy over the tasks: {_percent(figures['mean_task_accuracy'])}")
    left_out = figures["left_out_of_accuracy"]
    lines.append(
        f"left out of every accuracy above: {left_out} sample(s) that no prediction can get right"
        if left_out
        else "left out of the accuracy: none"
    )
    for key, what in (
        ("unknown_labels", "with a label that is no class of the export"),
        ("unlearned_classes", "of classes of tasks not learned yet"),
    ):
        part = figures[key]
        if part["samples"]:
            lines.append(f"  {part['samples']} {what}: {_examples(part)}")
    shown, pairs = figures["confusions"], figures["confusion_pairs"]
    if shown:
        lines.append(
            f"most frequent errors (true -> predicted), {len(shown)} of {pairs} pair(s), {figures['wrong']} wrong:"
        )
        lines += [f"{c['samples']:>8}  {c['true']} -> {c['predicted']}" for c in shown]
    elif figures["wrong"]:
        lines.append(f"{figures['wrong']} wrong in {pairs} (true, predicted) pair(s) (--top 0: none shown)")
    return "\n".join(lines)
