"""Clients on their own data, for the tests: per-client files cut from tests/data/own-text, and a tiny run."""

from __future__ import annotations

import csv
from pathlib import Path

from common.run.config import RunConfig

ROOT = Path(__file__).resolve().parents[1]
OWN_TEXT = ROOT / "tests" / "data" / "own-text"
SCHEDULED = ["alarm", "balance", "greeting", "music"]  # two tasks of two classes; timer and weather are in none
Rows = list[tuple[str, str]]


def own_text_rows(split: str) -> Rows:
    with (OWN_TEXT / f"{split}.csv").open(newline="") as f:
        return [(row["text"], row["label"]) for row in csv.DictReader(f)]


def by_label(rows: Rows) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for text, label in rows:
        out.setdefault(label, []).append(text)
    return out


def write_rows(path: Path, rows: Rows) -> Path:
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(["text", "label"])
        writer.writerows(rows)
    return path


def disjoint_clients(folder: Path) -> Path:
    """Three clients' disjoint files of own-text: client 0 holds every scheduled class (6 rows each),
    client 1 only task 0's (alarm, balance: none of task 1), client 2 only task 1's and 6 rows of
    ``timer``, a label in no task. Test splits: clients 0 and 2 (``client<i>-test.csv``, halves of the
    scheduled classes' test rows); client 1 has none."""
    folder.mkdir(parents=True, exist_ok=True)
    train = by_label(own_text_rows("train"))
    shares = {
        0: [(label, slice(0, 6)) for label in SCHEDULED],
        1: [("alarm", slice(6, 12)), ("balance", slice(6, 12))],
        2: [("greeting", slice(6, 12)), ("music", slice(6, 12)), ("timer", slice(0, 6))],
    }
    for i, share in shares.items():
        write_rows(folder / f"client{i}.csv", [(text, label) for label, cut in share for text in train[label][cut]])
    test = [row for row in own_text_rows("test") if row[1] in SCHEDULED]
    write_rows(folder / "client0-test.csv", test[0::2])
    write_rows(folder / "client2-test.csv", test[1::2])
    return folder


def owned_config(clients_dir: Path | None = None, **changes: object) -> RunConfig:
    """A run of tiny-bert on the clients' own files: classes ``SCHEDULED`` in 2 tasks, seconds on one thread.
    ``clients_dir``: the engine's folder of every client's data (absent: a coordinator's configuration)."""
    data: dict[str, object] = {"owned": True, "classes": list(SCHEDULED)}
    if clients_dir is not None:
        data["clients_dir"] = str(clients_dir)
    base = dict(
        run_id="owned",
        dataset="textfile",
        backbone="tiny-bert",
        num_tasks=2,
        num_clients=3,
        rounds_per_task=2,
        local_epochs=1,
        rank=2,
        max_length=16,
        lr=3e-2,
        lr_lora=1e-3,
        threads=1,
        seed=5,
        settings={"data": data},
    )
    return RunConfig(**{**base, **changes})  # type: ignore[arg-type]
