"""The paper's figures: its FAA per (dataset, method, beta), read from ``lab/paper_faa.json`` (data, not code:
a figure is changed there). The benchmark's tables (``lab/rows.py``) set each row beside the paper's value
where the paper reports one."""

from __future__ import annotations

import json
from pathlib import Path

PAPER_FILE = Path(__file__).with_name("paper_faa.json")


def load_paper_faa(path: Path = PAPER_FILE) -> dict[tuple[str, str, float | None], float]:
    """The paper's FAA (%) keyed by (config.dataset, method, beta); beta None: every beta. Each block of the file
    gives its dataset's figures per method, one per beta of its ``betas`` in order; a later block's figure of the
    same key stands."""
    faa: dict[tuple[str, str, float | None], float] = {}
    for block in json.loads(path.read_text())["blocks"]:
        for method, values in block["faa"].items():
            if len(values) != len(block["betas"]):
                raise ValueError(
                    f"{path}: {block['dataset']}/{method}: expected one figure per beta {block['betas']}, got {values}"
                )
            faa |= {(block["dataset"], method, beta): float(value) for beta, value in zip(block["betas"], values)}
    return faa


# The paper's FAA (%), keyed by (config.dataset, method, beta); beta None: every beta (docs/METHOD.md §7).
PAPER_FAA: dict[tuple[str, str, float | None], float] = load_paper_faa()


def paper_faa(dataset: str, method: str, beta: float) -> float | None:
    for key in ((dataset, method, round(beta, 6)), (dataset, method, None)):
        if key in PAPER_FAA:
            return PAPER_FAA[key]
    return None
