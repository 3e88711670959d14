"""The figures of full-data cells that docs/RESULTS.md and docs/METHODS.md quote by hand, in tables and passages,
against the committed cells: an explicit list of where each figure stands and which cell gives it, so that a figure
changed in the Markdown, or a cell changed under it, fails. Figures are compared as quoted (``96.13`` is the FAA
rounded to two decimals, ``1,902 s`` the time to the second); a table cell quoting one figure for several cells, or a
range ``low–high`` of them, holds for each."""

from __future__ import annotations

import json
import math
import re
import statistics
from pathlib import Path

from lab.rows import cell_seconds

ROOT = Path(__file__).resolve().parents[1]
RESULTS_DIR = ROOT / "docs" / "results"
GAMMA_05 = "clinc150-full-diag/gamma-head-0.5"  # LoRM's and its ablations' beta 0.2 cells at head gamma 0.5


def _group(spec: str, results: Path = RESULTS_DIR) -> list[dict]:
    """The cells ``spec`` names: ``"LABEL BETA"`` (seed 0), ``"LABEL BETA SEED"`` (``*``: every seed), and a fourth
    word for a set under docs/results other than ``clinc150-full``."""
    words = spec.split()
    label, beta = words[:2]
    seed = words[2] if len(words) > 2 else "0"
    where = words[3] if len(words) > 3 else "clinc150-full"
    paths = sorted((results / where / "cells" / label / f"beta{beta}").glob(f"seed{seed}/metrics.json"))
    assert paths, f"no cell {spec}"
    return [json.loads(p.read_text()) for p in paths]


def _faa(cells: list[dict]) -> list[float]:
    """The FAA, and beside it the seeds' sample std where there are several (``83.67 ± 0.60``)."""
    values = [float(c["faa"]) for c in cells]
    return [statistics.mean(values)] + ([statistics.stdev(values)] if len(values) > 1 else [])


# A quoted figure's field: the numbers its cells give (means over seeds where a group has several).
FIELDS = {
    "faa": _faa,
    "forgetting": lambda cells: [statistics.mean(float(c["forgetting"]) for c in cells)],
    "mb": lambda cells: [statistics.mean(float(c["bytes_per_client"]) / 1e6 for c in cells)],
    "s": lambda cells: [statistics.mean(cell_seconds(c) for c in cells)],
    "min": lambda cells: [statistics.mean(cell_seconds(c) / 60 for c in cells)],
    "gb": lambda cells: [max(float(c["peak_rss_bytes"]) / 1e9 for c in cells)],
    "faa_mean": lambda cells: _faa(cells)[:1],
    "faa_std": lambda cells: _faa(cells)[1:],
}
NUMBER = re.compile(r"[−-]?\d[\d,]*(?:\.\d+)?")


def _agrees(quoted: str, expected: list[float]) -> bool:
    """Whether the figures in ``quoted`` are ``expected`` rounded as quoted: one figure each, one figure that all
    round to, or a range ``low–high`` of them."""
    numbers = [n.replace("−", "-").replace(",", "") for n in NUMBER.findall(quoted.replace("**", ""))]

    def shown(value: float, like: str) -> str:
        return f"{value:.{len(like.partition('.')[2])}f}"

    rounded = sorted({shown(v, numbers[0]) for v in expected}, key=float) if numbers else []
    if len(numbers) == 2 and "–" in quoted:
        return [rounded[0], rounded[-1]] == numbers
    if len(numbers) == len(expected):
        return all(shown(v, n) == n for v, n in zip(expected, numbers))
    return len(numbers) == 1 and rounded == numbers


def _row(text: str, section: str, start: str) -> dict[str, str]:
    """The one row of a table under ``### section`` whose line starts with ``| start``, by column header."""
    body = text.split(f"### {section}\n", 1)[1].split("\n#", 1)[0]
    header: list[str] = []
    found = []
    for line in body.splitlines():
        if not line.startswith("|"):
            header = []
            continue
        cells = [cell.strip() for cell in line.strip().strip("|").split("|")]
        if not header:
            header = cells
        elif line.startswith(f"| {start}"):
            found.append(dict(zip(header, cells)))
    assert len(found) == 1, f"{len(found)} rows of '{section}' start with {start!r}"
    return found[0]


def _three_seeds(label: str, beta: str) -> list[str]:
    """A passage's figures of seeds 0, 1 and 2 at one beta (FAA, forgetting, minutes, GB each), then their mean and
    std."""
    each = [
        f"{field} {label} {beta}{seed}" for seed in ("", " 1", " 2") for field in ("faa", "forgetting", "min", "gb")
    ]
    return [*each, f"faa_mean {label} {beta} *", f"faa_std {label} {beta} *"]


SYSTEM = ("The same in the system, full training set", {"FAA": "faa", "bytes per client": "mb", "time": "s"})
MPNET = (
    "A stronger encoder: all-mpnet-base-v2",
    {"FAA": "faa", "forgetting": "forgetting", "bytes per client": "mb", "time": "min", "peak memory": "gb"},
)
PROTOCOL = (
    "The full-data protocol",
    {"FAA": "faa", "forgetting": "forgetting", "bytes per client": "mb", "time": "min"},
)
COMPETITORS = (
    "The competitors on the full data",
    {"FAA": "faa", "forgetting": "forgetting", "bytes per client": "mb", "time": "min"},
)
# (the table's section and columns, how its row starts, the cells of the row: one group per figure of a column)
QUOTED_ROWS = [
    (SYSTEM, "`lorm-ridge` RP-5000, last layer, paper's order", ["lorm-ridge 0.5"]),
    (SYSTEM, "`ridge@3layers` (", ["ridge@3layers 0.5"]),
    (SYSTEM, "`ridge@3layers+val`", ["ridge@3layers+val 0.5"]),
    (SYSTEM, "`ridge@4layers+valx4` (", ["ridge@4layers+valx4 0.5"]),
    (SYSTEM, "`ridge@4layers+valx4avg`", ["ridge@4layers+valx4avg 0.5"]),
    (SYSTEM, "`lorm-ridge@3layers`", ["lorm-ridge@3layers 0.5"]),
    (SYSTEM, "the same at β 1.0 (rank 2;", ["lorm-ridge@3layers 1.0"]),
    (SYSTEM, "the same at β 0.2 (its first run resumed once", ["lorm-ridge@3layers 0.2"]),
    (SYSTEM, "`lorm-ridge-first@3layers`", ["lorm-ridge-first@3layers 0.5"]),
    (SYSTEM, "the same at β 1.0 (rank 1;", ["lorm-ridge-first@3layers 1.0"]),
    (SYSTEM, "the same at β 0.2 (run again", ["lorm-ridge-first@3layers 0.2"]),
    (MPNET, "`ridge@4layers+valx4avg` (MiniLM", ["ridge@4layers+valx4avg 0.5"]),
    (MPNET, "`ridge@mpnet-4layers+valx4avg`", ["ridge@mpnet-4layers+valx4avg 0.5"]),
    (MPNET, "`ridge@mpnet-6layers+valx4avg` (", ["ridge@mpnet-6layers+valx4avg 0.5"]),
    (MPNET, "`ridge@mpnet-6layers+valx4avg`, seed 1", ["ridge@mpnet-6layers+valx4avg 0.5 1"]),
    (MPNET, "`ridge@mpnet-6layers+valx4avg`, seed 2", ["ridge@mpnet-6layers+valx4avg 0.5 2"]),
    (PROTOCOL, "`lorm` (run again", ["lorm 1.0"]),
    (PROTOCOL, "`lorm`, seeds 1 and 2 (27124ac", ["lorm 1.0 1", "lorm 1.0 2"]),
    (PROTOCOL, "`lorm` (a rerun", ["lorm 0.5"]),
    (PROTOCOL, "`lorm`, seeds 1 and 2 (8200015", ["lorm 0.5 1", "lorm 0.5 2"]),
    (PROTOCOL, "`lorm` (head γ 0.7", ["lorm 0.2"]),
    (PROTOCOL, "`lorm`, seeds 1 and 2 (7d878b3", ["lorm 0.2 1", "lorm 0.2 2"]),
    (PROTOCOL, "`lorm` at head γ 0.5", [f"lorm 0.2 0 {GAMMA_05}"]),
    (
        PROTOCOL,
        "the same, seeds 1 and 2 (ba5836c",
        [f"lorm 0.2 1 {GAMMA_05}", f"lorm 0.2 2 {GAMMA_05}"],
    ),
    (PROTOCOL, "`lorm@appendix-gamma`", ["lorm 0.2 0 clinc150-full-diag/gamma-head-0.1"]),
    (PROTOCOL, "the same, seed 1", ["lorm 0.2 1 clinc150-full-diag/gamma-head-0.1"]),
    (PROTOCOL, "the same, batch 32", ["lorm 0.2 0 clinc150-full-diag/batch32"]),
    (PROTOCOL, "`lorm` (H100", ["lorm 0.5 0 clinc150-full-h100-check"]),
    (PROTOCOL, "`lorm-b-only` (B trained", ["lorm-b-only 0.5"]),
    (PROTOCOL, "`lorm-b-only` (H100", ["lorm-b-only 1.0", f"lorm-b-only 0.2 0 {GAMMA_05}"]),
    (PROTOCOL, "`lorm-b-only` at head γ 0.7", ["lorm-b-only 0.2"]),
    (PROTOCOL, "`lorm-avg-tasks` (task", ["lorm-avg-tasks 0.5"]),
    (PROTOCOL, "`lorm-avg-tasks` (H100", ["lorm-avg-tasks 1.0", f"lorm-avg-tasks 0.2 0 {GAMMA_05}"]),
    (PROTOCOL, "`lorm-avg-tasks` at head γ 0.7", ["lorm-avg-tasks 0.2"]),
    (PROTOCOL, "`fedavg-lora` (its first run", ["fedavg-lora 0.5"]),
    (PROTOCOL, "`fedavg-lora` (H100)", ["fedavg-lora 1.0", "fedavg-lora 0.2"]),
    (PROTOCOL, "`fedavg` (", ["fedavg 0.5"]),
    (PROTOCOL, "`fedavg` at β 1.0", ["fedavg 1.0", "fedavg 0.2"]),
    (PROTOCOL, "`regmean` (H100)", ["regmean 1.0", "regmean 0.5", "regmean 0.2"]),
    (PROTOCOL, "`ties` (H100)", ["ties 1.0", "ties 0.5", "ties 0.2"]),
    (PROTOCOL, "`ties@tuned`", ["ties@tuned 1.0", "ties@tuned 0.5", "ties@tuned 0.2"]),
    (PROTOCOL, "`fisheravg` (sampled", ["fisheravg 1.0", "fisheravg 0.5", "fisheravg 0.2"]),
    (PROTOCOL, "`fisheravg`, seed 1", ["fisheravg 1.0 1", "fisheravg 0.2 1"]),
    (PROTOCOL, "`fisheravg`, seed 2", ["fisheravg 1.0 2", "fisheravg 0.2 2"]),
    (PROTOCOL, "`fisheravg`, seeds 1 and 2", ["fisheravg 0.5 1", "fisheravg 0.5 2"]),
    (PROTOCOL, "`ncm`", ["ncm 1.0", "ncm 0.5", "ncm 0.2"]),
    (PROTOCOL, "`ridge` (RP-5000;", ["ridge 1.0", "ridge 0.5", "ridge 0.2"]),
    (PROTOCOL, "`lorm-ridge` (LoRM", ["lorm-ridge 0.5"]),
    (PROTOCOL, "`lorm-ridge` (H100)", ["lorm-ridge 1.0", "lorm-ridge 0.2"]),
    (PROTOCOL, "`joint@tuned`", ["joint@tuned 0.5"]),
    (COMPETITORS, "`lorm` (CPU, seeds 0–2)", ["lorm 0.5 *"]),
    (COMPETITORS, "`ccvr` |", ["ccvr 0.5"]),
    (COMPETITORS, "`pilora` |", ["pilora 0.5"]),
    (COMPETITORS, "`ccvr` at β", ["ccvr 1.0 *", "ccvr 0.5 *", "ccvr 0.2 *"]),
    (COMPETITORS, "`pilora` at β", ["pilora 1.0 *", "pilora 0.5 *", "pilora 0.2 *"]),
    (COMPETITORS, "`fedproto` |", ["fedproto 0.5"]),
    (COMPETITORS, "`fedproto` at β", ["fedproto 1.0", "fedproto 0.2"]),
    (COMPETITORS, "`l2p` (", ["l2p 0.5"]),
    (COMPETITORS, "`l2p@tuned` (", ["l2p@tuned 0.5"]),
    (COMPETITORS, "`l2p` at β", ["l2p 1.0", "l2p 0.2"]),
    (COMPETITORS, "`l2p@tuned` at β", ["l2p@tuned 1.0", "l2p@tuned 0.2"]),
    (COMPETITORS, "`ewc` (", ["ewc 0.5"]),
    (COMPETITORS, "`ewc` at β", ["ewc 1.0", "ewc 0.2"]),
    (COMPETITORS, "`ewc@reference` (", ["ewc@reference 0.5"]),
    (COMPETITORS, "`ewc@reference` at β 1.0", ["ewc@reference 1.0"]),
    (COMPETITORS, "`ewc@reference` at β 0.2", ["ewc@reference 0.2"]),
    (COMPETITORS, "`target` at β 1.0 / 0.2", ["target 1.0", "target 0.2"]),
    (COMPETITORS, "`lwf` (", ["lwf 0.5"]),
    (COMPETITORS, "`lwf` at β", ["lwf 1.0", "lwf 0.2"]),
    (COMPETITORS, "`coda-p` (", ["coda-p 0.5"]),
    (COMPETITORS, "`coda-p` at β", ["coda-p 1.0", "coda-p 0.2"]),
    (COMPETITORS, "`coda-p@tuned` (", ["coda-p@tuned 0.5"]),
    (COMPETITORS, "`coda-p@tuned` at β", ["coda-p@tuned 1.0", "coda-p@tuned 0.2"]),
    (COMPETITORS, "`lwf@tuned`", ["lwf@tuned 0.5"]),
    (COMPETITORS, "`target` (the grid", ["target 0.5"]),
]

# Figures quoted in prose: the passage (whitespace as one space, ``{}`` where a figure stands) and, for each
# figure, "FIELD" and the cells as ``_group`` names them (several joined by " & ": one figure for them all).
QUOTED_PROSE = [
    (
        "the domain-grouped order **{}** ({}; {} min beside two other cells), so the class order's effect is "
        "+10.9 (+11.0 before); seeds 1 and 2 **{}** and **{}** ({} / {} min)",
        [
            "faa lorm 0.5 0 clinc150-conventions-fixed/order-domains",
            "forgetting lorm 0.5 0 clinc150-conventions-fixed/order-domains",
            "min lorm 0.5 0 clinc150-conventions-fixed/order-domains",
            "faa lorm 0.5 1 clinc150-conventions-fixed/seeds",
            "faa lorm 0.5 2 clinc150-conventions-fixed/seeds",
            "min lorm 0.5 1 clinc150-conventions-fixed/seeds",
            "min lorm 0.5 2 clinc150-conventions-fixed/seeds",
        ],
    ),
    (
        "padding rows counted in the Grams **{}** (forgetting {}; {} min), no dropout **{}** ({}; {} min), against "
        "the defaults' {} ({}):",
        [
            "faa lorm 0.5 0 clinc150-conventions-fixed/gram-padding",
            "forgetting lorm 0.5 0 clinc150-conventions-fixed/gram-padding",
            "min lorm 0.5 0 clinc150-conventions-fixed/gram-padding",
            "faa lorm 0.5 0 clinc150-conventions-fixed/no-dropout",
            "forgetting lorm 0.5 0 clinc150-conventions-fixed/no-dropout",
            "min lorm 0.5 0 clinc150-conventions-fixed/no-dropout",
            "faa lorm 0.5 0 clinc150-quick",
            "forgetting lorm 0.5 0 clinc150-quick",
        ],
    ),
    (
        "`lorm` over three seeds at β 0.2 with head γ 0.5: {} / {} / {}, {} ± {}, +2.14 above the paper's 77.67; "
        "seeds 1 and 2 held at most {} GB each.",
        [
            *(f"faa lorm 0.2 {seed} {GAMMA_05}" for seed in (0, 1, 2)),
            f"faa_mean lorm 0.2 * {GAMMA_05}",
            f"faa_std lorm 0.2 * {GAMMA_05}",
            f"gb lorm 0.2 1 {GAMMA_05} & lorm 0.2 2 {GAMMA_05}",
        ],
    ),
    (
        "cell, code `7d878b3`, the γ given as `--set gamma_head=0.7`, which the grid file's entry now sets): {} / {} / "
        "{}, **{} ± {}**, +2.83 above the paper,",
        ["faa lorm 0.2", "faa lorm 0.2 1", "faa lorm 0.2 2", "faa_mean lorm 0.2 *", "faa_std lorm 0.2 *"],
    ),
    ("by seed (+1.27, +0.16, +0.66), at {} / {} / {} GB peak.", ["gb lorm 0.2", "gb lorm 0.2 1", "gb lorm 0.2 2"]),
    (
        "With every β at three seeds, LoRM loses 5.5 points from β 1.0 to 0.2 ({} to {})",
        ["faa_mean lorm 1.0 *", "faa_mean lorm 0.2 *"],
    ),
    ("5.0 and 6.2 over its three seeds there, {} ± {}; with γ 0.5", ["faa_mean lorm 0.2 *", "faa_std lorm 0.2 *"]),
    (
        "(0.3 above its three seeds' mean, {} ± {}; 1.5 and 1.0 above LoRM's γ 0.5 cells, {} and {} ± {})",
        [
            "faa_mean lorm 0.2 *",
            "faa_std lorm 0.2 *",
            f"faa lorm 0.2 0 {GAMMA_05}",
            f"faa_mean lorm 0.2 * {GAMMA_05}",
            f"faa_std lorm 0.2 * {GAMMA_05}",
        ],
    ),
    (
        "from its three seeds' mean, {} ± {}; single seeds.",
        ["faa_mean lorm 0.2 *", "faa_std lorm 0.2 *"],
    ),
    (
        "With the head γ 0.5 the two gave {} and {} at β 0.2 (H100), 0.2 and 0.9 above LoRM's γ 0.5 mean, {}.",
        [
            f"faa lorm-b-only 0.2 0 {GAMMA_05}",
            f"faa lorm-avg-tasks 0.2 0 {GAMMA_05}",
            f"faa_mean lorm 0.2 * {GAMMA_05}",
        ],
    ),
    ("its clean counterpart, `ridge@3layers+valx4avg`, gives {} (full data", ["faa ridge@3layers+valx4avg 0.5"]),
    (
        "`lorm` over three seeds at β 1.0 (rank 2): {} / {} / {}, **{} ± {}**",
        ["faa lorm 1.0", "faa lorm 1.0 1", "faa lorm 1.0 2", "faa_mean lorm 1.0 *", "faa_std lorm 1.0 *"],
    ),
    ("Seeds 1 and 2 held at most {} and {} GB (the first", ["gb lorm 1.0 1", "gb lorm 1.0 2"]),
    (
        "its seed 0 leads by 1.0 and 1.4, but its three seeds' mean ({} ± {})",
        ["faa_mean lorm 1.0 *", "faa_std lorm 1.0 *"],
    ),
    ("where its three seeds give {}, between the two ablations", ["faa_mean lorm 1.0 *"]),
    ("(0.4 below its three seeds' mean, {} ± {})", ["faa_mean lorm 1.0 *", "faa_std lorm 1.0 *"]),
    (
        "by 6.4 and 6.3 points over three seeds ({} and {} against {}; seed 0 alone: {} and {}, 6.9 and 6.4 above)",
        ["faa_mean ccvr 0.5 *", "faa_mean pilora 0.5 *", "faa_mean lorm 0.5 *", "faa ccvr 0.5", "faa pilora 0.5"],
    ),
    (
        "CCVR **{}** and **{}** (forgetting {}, {}), PILoRA **{}** and **{}** (forgetting {}, {}). With seeds 1 and 2",
        [
            *(f"{field} ccvr {beta}" for field in ("faa", "forgetting") for beta in ("1.0", "0.2")),
            *(f"{field} pilora {beta}" for field in ("faa", "forgetting") for beta in ("1.0", "0.2")),
        ],
    ),
    (
        "the one GPU, {} min each), three seeds each: CCVR **{} ± {} / {} ± {} / {} ± {}** and PILoRA **{} ± {} / {} "
        "± {} / {} ± {}** at β 1.0 / 0.5 / 0.2, 3.8, 6.4 and 7.5 (CCVR) and 3.8, 6.3 and 9.6 (PILoRA) above LoRM's "
        "three-seed means ({}, {}, {})",
        [
            "min "
            + " & ".join(f"{label} {beta} [12]" for label in ("ccvr", "pilora") for beta in ("1.0", "0.5", "0.2")),
            *(
                f"{field} {label} {beta} *"
                for label in ("ccvr", "pilora")
                for beta in ("1.0", "0.5", "0.2")
                for field in ("faa_mean", "faa_std")
            ),
            *(f"faa_mean lorm {beta} *" for beta in ("1.0", "0.5", "0.2")),
        ],
    ),
    (
        "`l2p` **{}** and **{}**, `l2p@tuned` **{}** and **{}**, 2.3 and 15.8 below LoRM's three-seed means ({}, {})",
        [
            "faa l2p 1.0",
            "faa l2p 0.2",
            "faa l2p@tuned 1.0",
            "faa l2p@tuned 0.2",
            "faa_mean lorm 1.0 *",
            "faa_mean lorm 0.2 *",
        ],
    ),
    (
        "them ({}), is an outlier in forgetting ({} against {} and {}): it learnt each task less",
        ["faa l2p 0.5", "forgetting l2p 0.5", "forgetting l2p 1.0", "forgetting l2p 0.2"],
    ),
    (
        "(host B, commit `610a78f`, one thread, beside two other sessions' jobs: its {} minutes are not comparable) "
        "held at most **{} GB**",
        ["min lorm 0.5 0 clinc150-full-rerun", "gb lorm 0.5 0 clinc150-full-rerun"],
    ),
    ("Four reruns at recorded code gave **{}**", ["faa lorm 0.5 0 clinc150-full-rerun & lorm 0.5"]),
    ("the fourth, at `811068a`, one thread beside one other cell: {} min, {} GB.", ["min lorm 0.5", "gb lorm 0.5"]),
    (
        "gives **{}** at every β (`ridge@mpnet-4layers+valx4avg`, {} MB per client",
        ["faa ridge@mpnet-4layers+valx4avg 0.5", "mb ridge@mpnet-4layers+valx4avg 0.5"],
    ),
    ("and **{}** on the last six blocks", ["faa ridge@mpnet-6layers+valx4avg 0.5"]),
    (
        "gives **{}** (forgetting {}, the same λ per task), seed 2 **{}** (forgetting {}, the same λ per task): "
        "**{} ± {}** over the three seeds. Seed 1's peak memory, {} GB against seed 0's {},",
        [
            "faa ridge@mpnet-6layers+valx4avg 0.5 1",
            "forgetting ridge@mpnet-6layers+valx4avg 0.5 1",
            "faa ridge@mpnet-6layers+valx4avg 0.5 2",
            "forgetting ridge@mpnet-6layers+valx4avg 0.5 2",
            "faa_mean ridge@mpnet-6layers+valx4avg 0.5 *",
            "faa_std ridge@mpnet-6layers+valx4avg 0.5 *",
            "gb ridge@mpnet-6layers+valx4avg 0.5 1",
            "gb ridge@mpnet-6layers+valx4avg 0.5",
        ],
    ),
    (
        "Seed 2's: {} GB too, {} min.",
        ["gb ridge@mpnet-6layers+valx4avg 0.5 2", "min ridge@mpnet-6layers+valx4avg 0.5 2"],
    ),
    (
        "held-out samples choose (**{} ± {}** over three seeds;",
        ["faa_mean ridge@mpnet-6layers+valx4avg 0.5 *", "faa_std ridge@mpnet-6layers+valx4avg 0.5 *"],
    ),
    (
        "gives **{}** (`ridge@3layers+valx4avg`), and on four layers, a choice that once looked at the test split, {} "
        '(`ridge@4layers+valx4avg`; "Choices made on held-out training samples only"); on three layers and one '
        "projection {} ({} with `val`)",
        [
            "faa ridge@3layers+valx4avg 0.5",
            "faa ridge@4layers+valx4avg 0.5",
            "faa ridge@3layers 0.5",
            "faa ridge@3layers+val 0.5",
        ],
    ),
    (
        "With the held-out head rate (`coda-p@tuned`) at β 1.0 and 0.2: **{}** and **{}** (forgetting {} and {})",
        [
            "faa coda-p@tuned 1.0",
            "faa coda-p@tuned 0.2",
            "forgetting coda-p@tuned 1.0",
            "forgetting coda-p@tuned 0.2",
        ],
    ),
    (
        "(−0.1 on the sweep; in the system, where held-out samples choose them, {}, −0.04)",
        ["faa ridge@3layers+valx4avg+views 0.5"],
    ),
    (
        "(`ridge@3layers+valx4avg+views`, otherwise as above), β 0.5, seed 0: **{}**, forgetting {}, λ 3.2e4 on "
        "every task (each row at a third of the weight: about the 1e5 of before), {} MB per client (the Gram's "
        "factor has three rows per sample: three times the bytes), {} min and {} GB peak on the 2-core Xeon",
        [
            "faa ridge@3layers+valx4avg+views 0.5",
            "forgetting ridge@3layers+valx4avg+views 0.5",
            "mb ridge@3layers+valx4avg+views 0.5",
            "min ridge@3layers+valx4avg+views 0.5",
            "gb ridge@3layers+valx4avg+views 0.5",
        ],
    ),
    (
        "cell of the LoRM family at a time; code `7d878b3`)[^7d878b3]: **{}** and **{}** (forgetting {} and {}), "
        "λ 3.2e4 on every task at both, the same bytes, {} and {} min, {} and {} GB peak;",
        [
            f"{field} ridge@3layers+valx4avg+views {beta}"
            for field in ("faa", "forgetting", "min", "gb")
            for beta in ("1.0", "0.2")
        ],
    ),
    (
        "So {} / {} / {} at β 1.0 / 0.5 / 0.2, within 0.18 of one another",
        [f"faa ridge@3layers+valx4avg+views {beta}" for beta in ("1.0", "0.5", "0.2")],
    ),
    (
        "(`ridge@3layers+valx4avg`, otherwise as above), full data, β 0.5, seed 0: **{}**, forgetting {}, λ 3.2e4 on "
        "the first two tasks and 1e5 on the next three, the same {} MB per client, {} min beside two other 1-thread "
        "cells, {} GB peak (resident set, logged). 0.31 below the four-layer ensemble, and 0.20 above one projection "
        "on the same layers with `val` (`ridge@3layers+val`, {})",
        [
            "faa ridge@3layers+valx4avg 0.5",
            "forgetting ridge@3layers+valx4avg 0.5",
            "mb ridge@3layers+valx4avg 0.5",
            "min ridge@3layers+valx4avg 0.5",
            "gb ridge@3layers+valx4avg 0.5",
            "faa ridge@3layers+val 0.5",
        ],
    ),
    (
        "({} / {} / {} at β 1.0 / 0.5 / 0.2, first task only; {} at β 0.5 on every task)",
        [
            "faa lorm-ridge-first@4layers+valx4avg 1.0",
            "faa lorm-ridge-first@4layers+valx4avg 0.5",
            "faa lorm-ridge-first@4layers+valx4avg 0.2",
            "faa lorm-ridge@4layers+valx4avg 0.5",
        ],
    ),
    (
        "the best method the system offers on CLINC150: **{}**, and **{}** with the `val` split",
        ["faa ridge@3layers 0.5", "faa ridge@3layers+val 0.5"],
    ),
    (
        "*hurts* it at every β ({} / {} / {} at β 1.0 / 0.5 / 0.2",
        ["faa lorm-ridge@3layers 1.0", "faa lorm-ridge@3layers 0.5", "faa lorm-ridge@3layers 0.2"],
    ),
    (
        "`lorm-ridge-first@3layers` at the three β: {} / {} / {}",
        ["faa lorm-ridge-first@3layers 1.0", "faa lorm-ridge-first@3layers 0.5", "faa lorm-ridge-first@3layers 0.2"],
    ),
    (
        "the ten-value default grid took {} s, five values with 20 % more samples {} s",
        ["s ridge@3layers 0.5", "s ridge@3layers+val 0.5"],
    ),
    (
        "full data, β 0.5, seed 0[^c2eb920]: **{}**, forgetting {}, λ 1e5 on the first task and 3.2e5 on the next "
        "four (the members' rule, as the sweep's), {} MB per client over the run (4.0 times `ridge@3layers+val`'s {} "
        "MB), {} min run again with the peak logged (code `811068a`, one other cell beside it: the same figures, {} GB "
        "peak; the first run took 60.9 min",
        [
            "faa ridge@4layers+valx4 0.5",
            "forgetting ridge@4layers+valx4 0.5",
            "mb ridge@4layers+valx4 0.5",
            "mb ridge@3layers+val 0.5",
            "min ridge@4layers+valx4 0.5",
            "gb ridge@4layers+valx4 0.5",
        ],
    ),
    (
        "Run again at β 1.0 with the peak logged (code `2977770`, one other cell beside it): the same figures, {} min, "
        "{} GB peak",
        ["min ridge@4layers+valx4 1.0", "gb ridge@4layers+valx4 1.0"],
    ),
    (
        "run again at β 1.0 with the peak logged, code `e625c55`, one other cell beside it: the same figures, {} min, "
        "{} GB peak, against {} GB for the members' rule",
        ["min ridge@4layers+valx4avg 1.0", "gb ridge@4layers+valx4avg 1.0", "gb ridge@4layers+valx4 1.0"],
    ),
    (
        "full data, β 0.5, seed 0[^80c542f]: **{}**, forgetting {}, λ 3.2e4 on the first task and 1e5 on the next "
        "four (half a decade below the members' rule each time, as on the sweep), the same {} MB per client, {} min "
        "run again with the peak logged (code `dabd65f`, one other cell beside it: the same figures, {} GB peak, "
        "against {} GB for the members' rule",
        [
            "faa ridge@4layers+valx4avg 0.5",
            "forgetting ridge@4layers+valx4avg 0.5",
            "mb ridge@4layers+valx4avg 0.5",
            "min ridge@4layers+valx4avg 0.5",
            "gb ridge@4layers+valx4avg 0.5",
            "gb ridge@4layers+valx4 0.5",
        ],
    ),
    (
        "β 0.2, seed 0: **{}**, forgetting {}, λ 3.2e4 on the first two tasks and 1e5 after, {} MB per client (the "
        "frozen head's {} plus LoRM's factors), {} min beside one other run (13 min of it paused), {} GB peak",
        [
            "faa lorm-ridge-first@4layers+valx4avg 0.2",
            "forgetting lorm-ridge-first@4layers+valx4avg 0.2",
            "mb lorm-ridge-first@4layers+valx4avg 0.2",
            "mb ridge@4layers+valx4avg 0.5",
            "min lorm-ridge-first@4layers+valx4avg 0.2",
            "gb lorm-ridge-first@4layers+valx4avg 0.2",
        ],
    ),
    (
        "β 0.5, seed 0: **{}**, forgetting {}, {} MB per client, {} min, {} GB peak; task 0 right after it",
        [
            "faa lorm-ridge-first@3layers+valx4avg 0.5",
            "forgetting lorm-ridge-first@3layers+valx4avg 0.5",
            "mb lorm-ridge-first@3layers+valx4avg 0.5",
            "min lorm-ridge-first@3layers+valx4avg 0.5",
            "gb lorm-ridge-first@3layers+valx4avg 0.5",
        ],
    ),
    ("on the same layers (`ridge@3layers+valx4avg`, {}) and 0.20 below", ["faa ridge@3layers+valx4avg 0.5"]),
    (
        "Seed 1 (one thread beside one other cell, a CI run and a demo; code `707045f`, whose ridge solve holds one "
        "work matrix): **{}**, forgetting {}, {} min, {} GB peak; task 0 right after it 98.22, at the end 96.33 / "
        "97.67 / 97.00 / 95.78 / 96.11. Seed 2 (one thread beside one other cell and light editing; code `f31a0e8`): "
        "**{}**, forgetting {}, {} min, {} GB peak; task 0 right after it 98.00, at the end 96.22 / 97.33 / 96.78 / "
        "96.11 / 97.00. **{} ± {}** over the three seeds",
        [
            "faa lorm-ridge-first@3layers+valx4avg 0.5 1",
            "forgetting lorm-ridge-first@3layers+valx4avg 0.5 1",
            "min lorm-ridge-first@3layers+valx4avg 0.5 1",
            "gb lorm-ridge-first@3layers+valx4avg 0.5 1",
            "faa lorm-ridge-first@3layers+valx4avg 0.5 2",
            "forgetting lorm-ridge-first@3layers+valx4avg 0.5 2",
            "min lorm-ridge-first@3layers+valx4avg 0.5 2",
            "gb lorm-ridge-first@3layers+valx4avg 0.5 2",
            "faa_mean lorm-ridge-first@3layers+valx4avg 0.5 *",
            "faa_std lorm-ridge-first@3layers+valx4avg 0.5 *",
        ],
    ),
    (
        "At β 1.0, seed 0 (one thread beside one other cell and test runs; code `9f75649`): **{}**, forgetting {}, {} "
        "min, {} GB peak; task 0 right after it 97.89, at the end 96.67 / 97.56 / 96.89 / 96.11 / 96.78. Seed 1 "
        "(likewise): **{}**, forgetting {}, {} min, {} GB peak; at the end 96.22 / 97.22 / 96.78 / 96.22 / 96.56. "
        "Seed 2 (likewise): **{}**, forgetting {}, {} min, {} GB peak; at the end 96.11 / 97.44 / 97.11 / 95.89 / "
        "97.00. **{} ± {}** over the three seeds at β 1.0, 0.19 above the frozen ensemble ({}). At β 0.2, seed 0 "
        "(likewise; code `641dd6e`): **{}**, forgetting {}, {} min, {} GB peak; task 0 right after it 97.78, at the "
        "end 95.78 / 97.56 / 97.22 / 95.67 / 96.44. Seed 1 (likewise): **{}**, forgetting {}, {} min, {} GB peak; at "
        "the end 96.11 / 97.44 / 96.89 / 95.67 / 96.56. Seed 2 (likewise; code `0bf3a42`): **{}**, forgetting {}, {} "
        "min, {} GB peak; at the end 96.78 / 97.78 / 96.67 / 95.67 / 97.00. **{} ± {}** over the three seeds at β 0.2. "
        "So {} / {} / {} at β 1.0 / 0.5 / 0.2",
        [
            *_three_seeds("lorm-ridge-first@3layers+valx4avg", "1.0"),
            "faa ridge@3layers+valx4avg 0.5",
            *_three_seeds("lorm-ridge-first@3layers+valx4avg", "0.2"),
            *(f"faa_mean lorm-ridge-first@3layers+valx4avg {beta} *" for beta in ("1.0", "0.5", "0.2")),
        ],
    ),
    (
        "**{}**, forgetting {}, the same λ and {} MB, {} min, {} GB peak",
        [
            "faa lorm-ridge-first@4layers+valx4avg 0.5",
            "forgetting lorm-ridge-first@4layers+valx4avg 0.5",
            "mb lorm-ridge-first@4layers+valx4avg 0.5",
            "min lorm-ridge-first@4layers+valx4avg 0.5",
            "gb lorm-ridge-first@4layers+valx4avg 0.5",
        ],
    ),
    (
        "**{}**, forgetting {}, the same λ, {} MB, {} min, {} GB peak",
        [
            "faa lorm-ridge-first@4layers+valx4avg 1.0",
            "forgetting lorm-ridge-first@4layers+valx4avg 1.0",
            "mb lorm-ridge-first@4layers+valx4avg 1.0",
            "min lorm-ridge-first@4layers+valx4avg 1.0",
            "gb lorm-ridge-first@4layers+valx4avg 1.0",
        ],
    ),
    (
        "β 0.5, seed 0: **{}**, forgetting {}, λ as the frozen head's, {} MB per client, {} min, {} GB peak",
        [
            "faa lorm-ridge@4layers+valx4avg 0.5",
            "forgetting lorm-ridge@4layers+valx4avg 0.5",
            "mb lorm-ridge@4layers+valx4avg 0.5",
            "min lorm-ridge@4layers+valx4avg 0.5",
            "gb lorm-ridge@4layers+valx4avg 0.5",
        ],
    ),
    (
        "**{}**, forgetting {}, the same λ path, {} MB per client, {} min, {} GB peak",
        [
            "faa lorm-ridge@4layers+valx4avg 1.0",
            "forgetting lorm-ridge@4layers+valx4avg 1.0",
            "mb lorm-ridge@4layers+valx4avg 1.0",
            "min lorm-ridge@4layers+valx4avg 1.0",
            "gb lorm-ridge@4layers+valx4avg 1.0",
        ],
    ),
    (
        "**{}**, forgetting {}, the same λ path again, {} MB per client, {} min, {} GB peak",
        [
            "faa lorm-ridge@4layers+valx4avg 0.2",
            "forgetting lorm-ridge@4layers+valx4avg 0.2",
            "mb lorm-ridge@4layers+valx4avg 0.2",
            "min lorm-ridge@4layers+valx4avg 0.2",
            "gb lorm-ridge@4layers+valx4avg 0.2",
        ],
    ),
    (
        "So {} / {} / {} at β 1.0 / 0.5 / 0.2, one seed each, every one below the frozen head ({}) and below LoRM on "
        "the first task only (`lorm-ridge-first@4layers+valx4avg`, {} / {} / {})",
        [
            "faa lorm-ridge@4layers+valx4avg 1.0",
            "faa lorm-ridge@4layers+valx4avg 0.5",
            "faa lorm-ridge@4layers+valx4avg 0.2",
            "faa ridge@4layers+valx4avg 0.5",
            "faa lorm-ridge-first@4layers+valx4avg 1.0",
            "faa lorm-ridge-first@4layers+valx4avg 0.5",
            "faa lorm-ridge-first@4layers+valx4avg 0.2",
        ],
    ),
    (
        "The {} min ran on one thread beside the test suite for 11 of them, the six blocks' {} min on two threads",
        ["min ridge@mpnet-4layers+valx4avg 0.5", "min ridge@mpnet-6layers+valx4avg 0.5"],
    ),
    ("MiniLM's {} ran beside one other cell", ["min ridge@4layers+valx4avg 0.5"]),
    (
        "`lorm` over three seeds at β 0.5: {} / {} / {}, **{} ± {}**",
        ["faa lorm 0.5 0", "faa lorm 0.5 1", "faa lorm 0.5 2", "faa_mean lorm 0.5 *", "faa_std lorm 0.5 *"],
    ),
    (
        "On the test split[^14fa521]: **{}** (the accuracy over all 150 intents; loss 0.038 after the last round; {} "
        "MB; {} min",
        ["faa joint@tuned 0.5", "mb joint@tuned 0.5", "min joint@tuned 0.5"],
    ),
    (
        "run again with the peak logged, code `811068a`, one other cell beside it: the same figures, {} GB peak; the "
        "first run took 61.7 min beside two to four other runs; at β 1.0, code `d1d3a46`, one other cell beside it: "
        "the same figures, {} min, {} GB), against the paper's joint",
        ["gb joint@tuned 0.5", "min joint@tuned 1.0", "gb joint@tuned 1.0"],
    ),
    ("`lorm-b-only` at β 0.5: {}, 1.0 below `lorm`", ["faa lorm-b-only 0.5"]),
    ("`lorm-avg-tasks` {}, level with `lorm` ({};", ["faa lorm-avg-tasks 0.5", "faa lorm 0.5"]),
    (
        "`fedavg-lora` at β 0.5: {}, 11.4 below `lorm` (quick protocol: 20.8 below), forgetting {} against LoRM's {}:",
        ["faa fedavg-lora 0.5", "forgetting fedavg-lora 0.5", "forgetting lorm 0.5"],
    ),
    (
        "the same command and protocol on the H100 gives {} (forgetting {}), the CPU {} ({})",
        [
            "faa lorm 0.5 0 clinc150-full-h100-check",
            "forgetting lorm 0.5 0 clinc150-full-h100-check",
            "faa lorm 0.5",
            "forgetting lorm 0.5",
        ],
    ),
    (
        "RegMean {} / {} / {} against LoRM's {} / {} / {} (",
        [
            "faa regmean 1.0",
            "faa regmean 0.5",
            "faa regmean 0.2",
            "faa lorm 1.0",
            "faa_mean lorm 0.5 *",
            "faa lorm 0.2",
        ],
    ),
    ("TIES {} / {} / {} (−1.4", ["faa ties 1.0", "faa ties 0.5", "faa ties 0.2"]),
    (
        "is 5.5 to 10.7 points *below* it on the full data ({} / {} / {})",
        ["faa ties@tuned 1.0", "faa ties@tuned 0.5", "faa ties@tuned 0.2"],
    ),
    (
        "`lorm-b-only` and `lorm-avg-tasks` at β 1.0 / 0.2: {} / {} and {} / {}, against `lorm`'s {} / {}:",
        [
            "faa lorm-b-only 1.0",
            "faa lorm-b-only 0.2",
            "faa lorm-avg-tasks 1.0",
            "faa lorm-avg-tasks 0.2",
            "faa lorm 1.0",
            "faa lorm 0.2",
        ],
    ),
    ("`fedavg-lora` at β 1.0 / 0.2: {} / {},", ["faa fedavg-lora 1.0", "faa fedavg-lora 0.2"]),
    (
        "`lorm-ridge` at β 1.0 / 0.2: {} / {} (β 0.5: {}), below the frozen `ridge` head's {} at every",
        ["faa lorm-ridge 1.0", "faa lorm-ridge 0.2", "faa lorm-ridge 0.5", "faa ridge 0.5"],
    ),
    (
        "**{} / {} / {}** at β 1.0 / 0.5 / 0.2, against `lorm`'s {} / {} (seed 0; {} ± {} over three seeds) / {}:",
        [
            "faa fisheravg 1.0",
            "faa fisheravg 0.5",
            "faa fisheravg 0.2",
            "faa lorm 1.0",
            "faa lorm 0.5",
            "faa_mean lorm 0.5 *",
            "faa_std lorm 0.5 *",
            "faa lorm 0.2",
        ],
    ),
    (
        "Seeds 1 and 2 of FisherAvg at β 1.0 and 0.2 gave **{}** and **{}**, then **{}** and **{}**: over seeds 0–2, "
        "**{} ± {}** and **{} ± {}**, 2.4 below LoRM's three-seed mean at β 1.0 and 0.04 above it at β 0.2 (0.7 above "
        "γ 0.5's). One thread each, two cells side by side on host B, beside other work: {} / {} min for seed 1, {} / "
        "{} min for seed 2 (upper bounds)",
        [
            "faa fisheravg 1.0 1",
            "faa fisheravg 0.2 1",
            "faa fisheravg 1.0 2",
            "faa fisheravg 0.2 2",
            "faa_mean fisheravg 1.0 *",
            "faa_std fisheravg 1.0 *",
            "faa_mean fisheravg 0.2 *",
            "faa_std fisheravg 0.2 *",
            "min fisheravg 1.0 1",
            "min fisheravg 0.2 1",
            "min fisheravg 1.0 2",
            "min fisheravg 0.2 2",
        ],
    ),
    (
        "At β 0.5 seeds 1 and 2 gave **{}** and **{}** ({} / {} min, side by side, beside a test run, a CI run and a "
        "demo for their first 20 min): over three seeds **{} ± {}**, 0.32 below LoRM's {} ± {}, where seed 0 alone had "
        "it 0.70 above.",
        [
            "faa fisheravg 0.5 1",
            "faa fisheravg 0.5 2",
            "min fisheravg 0.5 1",
            "min fisheravg 0.5 2",
            "faa_mean fisheravg 0.5 *",
            "faa_std fisheravg 0.5 *",
            "faa_mean lorm 0.5 *",
            "faa_std lorm 0.5 *",
        ],
    ),
    (
        "at β 1.0 and 0.2 (seed 0, host B) it gives **{}** and **{}**, 2.6 and 6.9 below LoRM's three-seed means, "
        "and 2.2 and 1.6 below FedAvg's seed 0 ({}, {}),",
        ["faa fedproto 1.0", "faa fedproto 0.2", "faa fedavg 1.0", "faa fedavg 0.2"],
    ),
    (
        "`ridge@3layers+val` at β 1.0 and 0.2 (seed 0, side by side, one thread each, {} / {} min, {} / {} GB peak) "
        "gives **{}** and **{}**, again",
        [
            "min ridge@3layers+val 1.0",
            "min ridge@3layers+val 0.2",
            "gb ridge@3layers+val 1.0",
            "gb ridge@3layers+val 0.2",
            "faa ridge@3layers+val 1.0",
            "faa ridge@3layers+val 0.2",
        ],
    ),
    ("Fisher, {} MB per client over the run, 161 times LoRM's {} MB", ["mb fisheravg 0.5", "mb lorm 0.5"]),
    ("frozen closed-form heads above (`ncm` {}, `ridge` {})", ["faa ncm 0.5", "faa ridge 0.5"]),
    ("FedProto ({}) is 3.1 below LoRM", ["faa fedproto 0.5"]),
    (
        "At β 1.0 and 0.2 (`lwf`, seed 0, an H200, six cells at a time): **{}** and **{}** (forgetting {} and {}), "
        "5.8 and 11.3 below LoRM's three-seed means ({}, {}) and 5.4 below FedAvg's seed 0 at both ({}, {}),",
        [
            "faa lwf 1.0",
            "faa lwf 0.2",
            "forgetting lwf 1.0",
            "forgetting lwf 0.2",
            "faa_mean lorm 1.0 *",
            "faa_mean lorm 0.2 *",
            "faa fedavg 1.0",
            "faa fedavg 0.2",
        ],
    ),
    ("(`l2p@tuned`) 4.6 below ({};", ["faa l2p@tuned 0.5"]),
    (
        "TARGET at β 1.0 (`target`, seed 0, host B, one thread): **{}** (forgetting {}), 11.0 below FedAvg's seed 0 "
        "({}) and 11.4 below LoRM's three-seed mean ({});",
        ["faa target 1.0", "forgetting target 1.0", "faa fedavg 1.0", "faa_mean lorm 1.0 *"],
    ),
    ("62.89). {} min on one thread beside other cells", ["min target 1.0"]),
    (
        "TARGET at β 0.2 (`target`, seed 0, host B, one thread beside one other cell; code `39b3feb`): **{}** "
        "(forgetting {}), 15.8 below FedAvg's seed 0 ({}) and 21.8 below LoRM's three-seed mean ({}); so {} / {} / {} "
        "at β 1.0 / 0.5 / 0.2",
        [
            "faa target 0.2",
            "forgetting target 0.2",
            "faa fedavg 0.2",
            "faa_mean lorm 0.2 *",
            "faa target 1.0",
            "faa target 0.5",
            "faa target 0.2",
        ],
    ),
    ("{} min on one thread beside one other cell ({} GB peak)", ["min target 0.2", "gb target 0.2"]),
    (
        "no different either; at β 1.0 it gives **{}** (forgetting {}), `ewc`'s figures, and at β 0.2 **{}** "
        "(forgetting {} against `ewc`'s {}), each with the same count correct",
        [
            "faa ewc@reference 1.0 & ewc 1.0",
            "forgetting ewc@reference 1.0 & ewc 1.0",
            "faa ewc@reference 0.2 & ewc 0.2",
            "forgetting ewc@reference 0.2",
            "forgetting ewc 0.2",
        ],
    ),
    (
        "At β 1.0 and 0.2 (`ewc`, seed 0, host B, one thread each, side by side) it gives **{}** and **{}** "
        "(forgetting {} and {}), 0.3 and 6.0 below LoRM's three-seed means ({}, {}) and within 0.05 of FedAvg's seed 0 "
        "at both ({}, {}):",
        [
            "faa ewc 1.0",
            "faa ewc 0.2",
            "forgetting ewc 1.0",
            "forgetting ewc 0.2",
            "faa_mean lorm 1.0 *",
            "faa_mean lorm 0.2 *",
            "faa fedavg 1.0",
            "faa fedavg 0.2",
        ],
    ),
    (
        "the sampled Fisher): **{}**, 1.5 below LoRM ({} over three seeds; 1.3 below its seed 0, {})",
        ["faa ewc 0.5", "faa_mean lorm 0.5 *", "faa lorm 0.5"],
    ),
    ("its diagonal Fisher: {} MB per client, 75 times LoRM's", ["mb ewc 0.5"]),
    ("gives **{}** (forgetting {}; its tasks", ["faa fedavg 0.5", "forgetting fedavg 0.5"]),
    (
        "one thread each, side by side; {} min each, {} and {} GB peak) give **{}** and **{}**, the same count",
        [
            "min ridge@3layers 1.0 & ridge@3layers 0.2",
            "gb ridge@3layers 1.0",
            "gb ridge@3layers 0.2",
            "faa ridge@3layers 1.0",
            "faa ridge@3layers 0.2",
        ],
    ),
    (
        "seed 1 at both ({} min each, side by side): **{}** and **{}**",
        ["min ridge@3layers 1.0 1 & ridge@3layers 0.2 1", "faa ridge@3layers 1.0 1", "faa ridge@3layers 0.2 1"],
    ),
    (
        "seed 2 at both ({} min each, side by side): **{}** and **{}**, so over three seeds the head gives "
        "**{} ± {}** at every β",
        [
            "min ridge@3layers 1.0 2 & ridge@3layers 0.2 2",
            "faa ridge@3layers 1.0 2",
            "faa ridge@3layers 0.2 2",
            "faa_mean ridge@3layers 1.0 * & ridge@3layers 0.5 * & ridge@3layers 0.2 *",
            "faa_std ridge@3layers 1.0 * & ridge@3layers 0.5 * & ridge@3layers 0.2 *",
        ],
    ),
    (
        "At β 1.0 and 0.2 (`coda-p`, seed 0): **{}** and **{}** (forgetting {} and {}), 9.4 and 26.3 below LoRM's "
        "three-seed means ({}, {})",
        [
            "faa coda-p 1.0",
            "faa coda-p 0.2",
            "forgetting coda-p 1.0",
            "forgetting coda-p 0.2",
            "faa_mean lorm 1.0 *",
            "faa_mean lorm 0.2 *",
        ],
    ),
    (
        "At β 1.0 and 0.2 (seed 0) FedAvg gives **{}** and **{}** (forgetting {} and {}), seed 1 (host B, one thread "
        "each, side by side, {} and {} min) **{}** and **{}**, and seed 2 (likewise, {} and {} min) **{}** and **{}**: "
        "**{} ± {}** and **{} ± {}** over three seeds. At β 0.5 seeds 1 and 2 (host B, one thread each, side by side, "
        "{} and {} min) give **{}** and **{}**, so **{} ± {}** over three seeds there. FedAvg is 0.5, 3.3 and 8.0 "
        "below LoRM's three-seed means at β 1.0, 0.5 and 0.2 ({}, {}, {}; seed 0 alone put it 0.4, 1.7 and 6.0 below",
        [
            "faa fedavg 1.0",
            "faa fedavg 0.2",
            "forgetting fedavg 1.0",
            "forgetting fedavg 0.2",
            "min fedavg 1.0 1",
            "min fedavg 0.2 1",
            "faa fedavg 1.0 1",
            "faa fedavg 0.2 1",
            "min fedavg 1.0 2",
            "min fedavg 0.2 2",
            "faa fedavg 1.0 2",
            "faa fedavg 0.2 2",
            "faa_mean fedavg 1.0 *",
            "faa_std fedavg 1.0 *",
            "faa_mean fedavg 0.2 *",
            "faa_std fedavg 0.2 *",
            "min fedavg 0.5 1",
            "min fedavg 0.5 2",
            "faa fedavg 0.5 1",
            "faa fedavg 0.5 2",
            "faa_mean fedavg 0.5 *",
            "faa_std fedavg 0.5 *",
            "faa_mean lorm 1.0 *",
            "faa_mean lorm 0.5 *",
            "faa_mean lorm 0.2 *",
        ],
    ),
    (
        "(`ewc@reference`: the true label's squared gradient weighted by `p(y|x)`, summed) gives {}:",
        ["faa ewc@reference 0.5"],
    ),
    (
        "(`lwf`, encoder 1e-4): **{}**, 6.9 below LoRM ({}), forgetting {};",
        ["faa lwf 0.5", "faa_mean lorm 0.5 *", "forgetting lwf 0.5"],
    ),
    ("(`lwf@tuned`, 1e-5): {}, 14.6 below LoRM, forgetting {}.", ["faa lwf@tuned 0.5", "forgetting lwf@tuned 0.5"]),
    (
        "(`lwf@tuned`, seed 0, host B, one thread beside one other cell, {} min, {} GB) at β 1.0: **{}** (forgetting "
        "{}), 4.9 below `lwf`",
        ["min lwf@tuned 1.0", "gb lwf@tuned 1.0", "faa lwf@tuned 1.0", "forgetting lwf@tuned 1.0"],
    ),
    (
        "At β 0.2 (the same host and company, {} min, {} GB): **{}** (forgetting {}), 13.2 below `lwf` ({}) and 24.5 "
        "below LoRM's three-seed mean ({})",
        [
            "min lwf@tuned 0.2",
            "gb lwf@tuned 0.2",
            "faa lwf@tuned 0.2",
            "forgetting lwf@tuned 0.2",
            "faa lwf 0.2",
            "faa_mean lorm 0.2 *",
        ],
    ),
    (
        "(`coda-p`): **{}**, 13.1 below LoRM, forgetting {}, for {} MB per client",
        ["faa coda-p 0.5", "forgetting coda-p 0.5", "mb coda-p 0.5"],
    ),
    (
        "(`coda-p@tuned`, 1e-1, +13.1 there): **{}**, +1.2 (forgetting {})",
        ["faa coda-p@tuned 0.5", "forgetting coda-p@tuned 0.5"],
    ),
    ("(`target`): **{}**, 15.1 below FedAvg ({})", ["faa target 0.5", "faa fedavg 0.5"]),
    ("{} min with two threads on the 2-core Intel Xeon", ["min target 0.5"]),
    (
        "held at most **{} GB** (resident set, clients and coordinator in one process): against the {} GB",
        ["gb lorm 0.5 0 clinc150-full-rerun", "gb ridge@mpnet-6layers+valx4avg 0.5"],
    ),
    (
        "`lorm-ridge` on this head is **{}** at β 0.5, 0.69 *below* the frozen head ({})",
        ["faa lorm-ridge 0.5", "faa ridge 0.5"],
    ),
    ("so bytes grow linearly with the width: {} MB at 10,000", ["mb ridge@3layers 0.5"]),
    ("That is 0.25 above the system's best until now (`ridge@3layers+val`, {})", ["faa ridge@3layers+val 0.5"]),
    ("+0.26 over the members' rule ({}) in the system", ["faa ridge@4layers+valx4 0.5"]),
    ("0.11 below the frozen head ({}), as on three layers", ["faa ridge@4layers+valx4avg 0.5"]),
    (
        "So {} / {} / {} at β 1.0 / 0.5 / 0.2 against the frozen head's {} at every β",
        [
            "faa lorm-ridge-first@4layers+valx4avg 1.0",
            "faa lorm-ridge-first@4layers+valx4avg 0.5",
            "faa lorm-ridge-first@4layers+valx4avg 0.2",
            "faa ridge@4layers+valx4avg 0.5",
        ],
    ),
    (
        "1.06 below the frozen head, as on three layers ({} against {})",
        ["faa lorm-ridge@3layers 0.5", "faa ridge@3layers 0.5"],
    ),
    (
        "- **{} at every β: the goal of 97.0 is met**, by the frozen four-projection ensemble on MPNet's last six "
        "blocks (the held-out samples' choice) with CLINC150's `val` split training too; **{}** on the last four",
        ["faa ridge@mpnet-6layers+valx4avg 0.5", "faa ridge@mpnet-4layers+valx4avg 0.5"],
    ),
    (
        "above the frozen three-layer ridge head on the training set ({}), and below the frozen heads that use the "
        "`val` split too ({}, {})",
        ["faa ridge@3layers 0.5", "faa ridge@3layers+val 0.5", "faa ridge@4layers+valx4avg 0.5"],
    ),
    ("`ridge` here is {}; the older script", ["faa ridge 0.5"]),
    (
        "(0.1, this grid's setting before either) `lorm` is {}, −3.94",
        ["faa lorm 0.2 0 clinc150-full-diag/gamma-head-0.1"],
    ),
    (
        "seed 1 gives {} (mean {}, −3.51)",
        ["faa lorm 0.2 1 clinc150-full-diag/gamma-head-0.1", "faa_mean lorm 0.2 * clinc150-full-diag/gamma-head-0.1"],
    ),
    ("its head γ not recorded): {}, +0.31", ["faa lorm 0.2 0 clinc150-full-diag/batch32"]),
    ("(the paper's value at β 1.0 and 0.5): **{}, +5.60**", [f"faa lorm 0.2 0 {GAMMA_05}"]),
    (
        "All this while sending {} MB per client where these send the whole encoder's update ({} MB; RegMean its "
        "Grams too, {} MB)",
        ["mb lorm 0.5", "mb ties 0.5", "mb regmean 0.5"],
    ),
    ("Its forgetting ({} at β 0.5) is above LoRM's ({})", ["forgetting fisheravg 0.5", "forgetting lorm 0.5"]),
    ("forgetting {} against LoRM's {}. Right after each task", ["forgetting ewc 0.5", "forgetting lorm 0.5"]),
    ("FedAvg is 1.4 below LoRM's seed 0 ({})", ["faa lorm 0.5"]),
    ("for the same {} MB per client as FedAvg", ["mb target 0.5"]),
    ("never sent). Forgetting {}:", ["forgetting target 0.5"]),
    (
        "a frozen encoder with prompts, {} MB per client, forgetting {}.",
        ["mb l2p@tuned 0.5", "forgetting l2p@tuned 0.5"],
    ),
    (
        "the same bytes ({} MB). 0.18 apart",
        ["mb lorm 0.5 0 clinc150-full-h100-check & lorm 0.5"],
    ),
    ("(a third of LoRM's {})", ["mb lorm 0.5"]),
    ("layers 3–6 in `ridge@4layers+valx4avg` ({})", ["faa ridge@4layers+valx4avg 0.5"]),
]


# The figures of full-data cells that docs/METHODS.md quotes in its "which to use" passages and its notes (its
# held-out tuning figures and differences between figures aside), as QUOTED_PROSE names them.
QUOTED_METHODS = [
    (
        "**{}** FAA (**{} ± {}** over seeds 0 to 2;",
        [
            "faa ridge@mpnet-6layers+valx4avg 0.5 0",
            "faa_mean ridge@mpnet-6layers+valx4avg 0.5 *",
            "faa_std ridge@mpnet-6layers+valx4avg 0.5 *",
        ],
    ),
    (
        "as `ncm`, `ridge` and `ridge@3layers` show at all three, and each run serves every β; {} on the last four "
        "blocks), {} MB sent per client over the run, "
        "{} GB of peak memory in one process ({} GB since the coordinator's solve holds one work matrix, seed 1), {} "
        "minutes on two threads",
        [
            "faa ridge@mpnet-4layers+valx4avg 0.5",
            "mb ridge@mpnet-6layers+valx4avg 0.5",
            "gb ridge@mpnet-6layers+valx4avg 0.5",
            "gb ridge@mpnet-6layers+valx4avg 0.5 1",
            "min ridge@mpnet-6layers+valx4avg 0.5",
        ],
    ),
    (
        "**{}** FAA at every β (seed 0), **{}** when CLINC150's `val` split trains too. It sends {} MB per",
        ["faa ridge@3layers 0.5", "faa ridge@3layers+val 0.5", "mb ridge@3layers 0.5"],
    ),
    (
        "split training too, reaches **{}**, the best frozen head on MiniLM chosen on held-out samples alone; it "
        "sends {} MB per client over the run (four times the single head), and the in-process run held at most {} "
        "GB ({} minutes on one core beside two other runs). On four layers, a choice that once looked at the test "
        "split, the same ensemble gives {} (RESULTS",
        [
            "faa ridge@3layers+valx4avg 0.5",
            "mb ridge@3layers+valx4avg 0.5",
            "gb ridge@3layers+valx4avg 0.5",
            "min ridge@3layers+valx4avg 0.5",
            "faa ridge@4layers+valx4avg 0.5",
        ],
    ),
    ("back to the members' summed errors ({} on four layers).", ["faa ridge@4layers+valx4 0.5"]),
    (
        "with them the ensemble gives **{}** for {} MB per client (three factor rows per sample), {} GB peak",
        [
            "faa ridge@3layers+valx4avg+views 0.5",
            "mb ridge@3layers+valx4avg+views 0.5",
            "gb ridge@3layers+valx4avg+views 0.5",
        ],
    ),
    ("`ridge` gives {} at every β (`lorm-bench`;", ["faa ridge 1.0 & ridge 0.5 & ridge 0.2"]),
    (
        "(`lorm-ridge`) {} / {} / {} at β 1.0 / 0.5 / 0.2",
        ["faa lorm-ridge 1.0", "faa lorm-ridge 0.5", "faa lorm-ridge 0.2"],
    ),
    (
        "on every task lowers it ({} / {} / {} at β",
        ["faa lorm-ridge@3layers 1.0", "faa lorm-ridge@3layers 0.5", "faa lorm-ridge@3layers 0.2"],
    ),
    (
        "head ({} / {} / {} at β 1.0 / 0.5 / 0.2), as under the four-head ensemble ({} / {} / {} against its {};",
        [
            "faa lorm-ridge-first@3layers 1.0",
            "faa lorm-ridge-first@3layers 0.5",
            "faa lorm-ridge-first@3layers 0.2",
            "faa lorm-ridge-first@4layers+valx4avg 1.0",
            "faa lorm-ridge-first@4layers+valx4avg 0.5",
            "faa lorm-ridge-first@4layers+valx4avg 0.2",
            "faa ridge@4layers+valx4avg 0.5",
        ],
    ),
    (
        "this `lorm` on the full training set {} / {} / {} (seed 0, 1 local epoch per round; over seeds 0-2, "
        "{} ± {} at β 1.0, {} ± {} at β 0.5 and {} ± {} at β 0.2, head γ 0.7 there",
        [
            "faa lorm 1.0",
            "faa lorm 0.5",
            "faa lorm 0.2",
            "faa_mean lorm 1.0 *",
            "faa_std lorm 1.0 *",
            "faa_mean lorm 0.5 *",
            "faa_std lorm 0.5 *",
            "faa_mean lorm 0.2 *",
            "faa_std lorm 0.2 *",
        ],
    ),
    ("CCVR {} and PILoRA {} over three seeds, both rebuilding", ["faa_mean ccvr 0.5 *", "faa_mean pilora 0.5 *"]),
    (
        "CCVR {} / {} / {} and PILoRA {} / {} / {} at β 1.0 / 0.5 / 0.2, three seeds each",
        [f"faa_mean {label} {beta} *" for label in ("ccvr", "pilora") for beta in ("1.0", "0.5", "0.2")],
    ),
    (
        "on layers 4 to 6, the held-out choice, {} ± {} / {} ± {} / {} ± {} at β 1.0 / 0.5 / 0.2 (three seeds each) "
        "against the frozen ensemble's {})",
        [
            *(
                f"faa_{stat} lorm-ridge-first@3layers+valx4avg {beta} *"
                for beta in ("1.0", "0.5", "0.2")
                for stat in ("mean", "std")
            ),
            "faa ridge@3layers+valx4avg 0.5",
        ],
    ),
    (
        "Fishers, 161 times LoRM's bytes) is level with LoRM at β 0.5: {} ± {} over three seeds, 0.32 below LoRM's "
        "mean ({} ± {}; its seed 0 alone, {}, was 0.70 above); over three seeds it is 2.4 below LoRM at β 1.0 "
        "({} ± {}) and 0.7 above it at β 0.2 ({} ± {})",
        [
            "faa_mean fisheravg 0.5 *",
            "faa_std fisheravg 0.5 *",
            "faa_mean lorm 0.5 *",
            "faa_std lorm 0.5 *",
            "faa fisheravg 0.5",
            "faa_mean fisheravg 1.0 *",
            "faa_std fisheravg 1.0 *",
            "faa_mean fisheravg 0.2 *",
            "faa_std fisheravg 0.2 *",
        ],
    ),
    (
        "within the paper's figure at β 0.2 ({} at 0.5, {} at 0.7, against {} at 0.1, seed 0; docs/RESULTS.md)",
        [f"faa lorm 0.2 0 {GAMMA_05}", "faa lorm 0.2", "faa lorm 0.2 0 clinc150-full-diag/gamma-head-0.1"],
    ),
]


def _quoted_mismatches(
    text: str, results: Path = RESULTS_DIR, rows: list = QUOTED_ROWS, prose: list = QUOTED_PROSE
) -> list[str]:
    """Every hand-quoted figure of ``rows`` and ``prose`` that its cells (under ``results``) do not give, as a line
    saying where."""
    wrong = []
    for (section, columns), start, groups in rows:
        row = _row(text, section, start)
        for column, field in columns.items():
            if row[column] in ("–", "-"):
                continue
            expected = [value for spec in groups for value in FIELDS[field](_group(spec, results))]
            if not _agrees(row[column], expected):
                wrong.append(f"{section} / {start} / {column}: quoted {row[column]!r}, the cells give {expected}")
    flat = re.sub(r"\s+", " ", text)
    for passage, figures in prose:
        pattern = f"({NUMBER.pattern})".join(re.escape(piece) for piece in passage.split("{}"))
        found = re.findall(pattern, flat)
        if len(found) != 1:
            wrong.append(f"{len(found)} passages read {passage!r}")
            continue
        quotes = found[0] if isinstance(found[0], tuple) else (found[0],)
        assert len(quotes) == len(figures), f"{passage!r} quotes {len(quotes)} figures, named {len(figures)}"
        for quoted, figure in zip(quotes, figures):
            field, specs = figure.split(" ", 1)
            expected = [value for spec in specs.split(" & ") for value in FIELDS[field](_group(spec, results))]
            if not _agrees(quoted, expected):
                wrong.append(f"{passage!r}: quoted {quoted!r} for {figure}, the cells give {expected}")
    return wrong


def test_hand_written_figures_are_the_cells():
    assert _quoted_mismatches((ROOT / "docs" / "RESULTS.md").read_text()) == []


def test_the_methods_pages_figures_are_the_cells():
    assert _quoted_mismatches((ROOT / "docs" / "METHODS.md").read_text(), rows=[], prose=QUOTED_METHODS) == []


def test_a_quoted_figure_changed_in_the_markdown_or_its_cell_fails(tmp_path):
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    row = "| `ridge@3layers` (default λ grid, decades 1e-2..1e7) | **96.13** | 1e5 × 5 | 168.0 MB | 798 s |"
    assert row in text
    rows = [r for r in QUOTED_ROWS if r[1] == "`ridge@3layers` ("]
    prose = [p for p in QUOTED_PROSE if p[0].startswith("the ten-value default grid")]
    assert _quoted_mismatches(text, rows=rows, prose=prose) == []
    edited = text.replace(row, row.replace("96.13", "96.14")).replace("grid took 798 s", "grid took 800 s")
    assert len(_quoted_mismatches(edited, rows=rows, prose=prose)) == 2
    # The same Markdown against a cell that changed: its copy with another FAA and time.
    for label in ("ridge@3layers", "ridge@3layers+val"):
        cell = RESULTS_DIR / "clinc150-full/cells" / label / "beta0.5/seed0/metrics.json"
        copy = tmp_path / cell.relative_to(RESULTS_DIR)
        copy.parent.mkdir(parents=True)
        copy.write_text(cell.read_text())
    metrics = json.loads(copy.read_text())
    copy.write_text(json.dumps(metrics | {"faa": metrics["faa"] + 0.01, "wall_seconds": metrics["wall_seconds"] + 60}))
    rows = [r for r in QUOTED_ROWS if r[1] == "`ridge@3layers+val`"]
    wrong = _quoted_mismatches(text, tmp_path, rows=rows, prose=prose)
    assert [w.split(":")[0] for w in wrong] == [
        f"{SYSTEM[0]} / `ridge@3layers+val` / FAA",
        f"{SYSTEM[0]} / `ridge@3layers+val` / time",
        repr(prose[0][0]),
    ]


def test_a_figure_agrees_only_as_rounded_where_it_stands():
    assert _agrees("**96.13**", [96.1311]) and not _agrees("96.14", [96.1311])
    assert _agrees("42 MB", [42.316]) and not _agrees("42.4 MB", [42.316])  # fewer decimals: rounded to those
    assert _agrees("1,902 s", [1901.9]) and _agrees("83.67 ± 0.60", [83.6733, 0.6012])
    assert _agrees("85.64 / **84.36** / 80.82", [85.644, 84.355, 80.8222])
    # One figure for several cells holds for each; a range gives the least and the most.
    assert _agrees("8.8 min", [8.78, 8.75]) and not _agrees("5.3 min", [5.29, 5.22])
    assert _agrees("5.2–5.3 min", [5.29, 5.22]) and _agrees("13.5–14.3 min", [13.46, 14.32, 13.5])
    assert _agrees("−0.94", [-0.9444]) and not _agrees("0.94", [-0.9444])


def _privacy_table(text: str, header: str) -> dict[str, list[str]]:
    """A table of docs/PRIVACY.md by its header line's start: its header cells and each row's, by first cell."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    table = {}
    for line in lines[start:]:
        if not line.startswith("|"):
            break
        cells = [c.strip() for c in line.strip("|").split("|")]
        table[cells[0]] = cells[1:]
    return table


def test_lorms_privacy_curve_reads_its_cells():
    """The LoRM curve's rows (docs/results/dp-clinc150/lorm-s0.json, drawn by bench/dp_ridge.py --plot) are
    bench/dp_cells.py's from the cells, and PRIVACY.md's LoRM table quotes each cell's FAA and forgetting."""
    from bench.dp_cells import rows

    committed = json.loads((RESULTS_DIR / "dp-clinc150" / "lorm-s0.json").read_text())
    assert committed == rows("lorm")
    table = _privacy_table((ROOT / "docs" / "PRIVACY.md").read_text(), "| `lorm` | ε")
    epsilons = [h.removeprefix("ε ").strip() for h in table["`lorm`"]]
    assert epsilons[-1] == "without DP"
    for column, epsilon in enumerate(epsilons):
        where = (
            RESULTS_DIR / "dp-clinc150" / f"epsilon{epsilon}"
            if epsilon != "without DP"
            else RESULTS_DIR / "clinc150-full"
        )
        cell = json.loads((where / "cells/lorm/beta0.5/seed0/metrics.json").read_text())
        for row, field in (("FAA", "faa"), ("forgetting", "forgetting")):
            assert _agrees(table[row][column], [float(cell[field])]), (epsilon, row, table[row][column])


def test_the_closed_form_heads_curves_at_replace_one_quote_their_rows():
    """PRIVACY.md's table of the MiniLM heads at the replace-one calibration quotes, cell by cell, the accuracy of
    each row of docs/results/dp-clinc150/replace-one/ (bench/dp_ridge.py --json)."""
    table = _privacy_table((ROOT / "docs" / "PRIVACY.md").read_text(), "| head, at replace-one | ε")
    epsilons = [float(h.removeprefix("ε ").strip()) for h in table["head, at replace-one"][:5]]
    files = {row: cells[-1].strip("`") for row, cells in table.items() if row != "head, at replace-one"}
    assert len(files) >= 5
    for row, name in files.items():
        if set(row) <= {"-"}:
            continue
        rows = {
            r["epsilon"]: r["accuracy"]
            for r in json.loads((RESULTS_DIR / "dp-clinc150" / "replace-one" / name).read_text())
        }
        for column, epsilon in enumerate(epsilons):
            assert _agrees(table[row][column], [rows[epsilon]]), (row, epsilon, table[row][column])


def test_the_engines_closed_form_cells_at_replace_one_quote_their_cells_and_equal_the_bench():
    """PRIVACY.md's engine cells at the replace-one calibration (docs/results/dp-clinc150/replace-one/engine/) are
    quoted cell by cell, each ran under replace-one at its budget, and each equals bench/dp_ridge.py's row of the
    same head and budget count for count (the same accuracy to the last digit)."""
    table = _privacy_table((ROOT / "docs" / "PRIVACY.md").read_text(), "| head, engine, at replace-one | ε")
    epsilons = [h.removeprefix("ε ").strip() for h in table["head, engine, at replace-one"]]
    for method in ("ridge", "ncm"):
        bench = {
            r["epsilon"]: r["accuracy"]
            for r in json.loads((RESULTS_DIR / "dp-clinc150" / "replace-one" / f"{method}-s0.json").read_text())
        }
        for column, epsilon in enumerate(epsilons):
            where = RESULTS_DIR / "dp-clinc150" / "replace-one" / "engine" / f"epsilon{epsilon}" / "cells" / method
            cell = json.loads((where / "beta0.5" / "seed0" / "metrics.json").read_text())
            assert cell["privacy"]["adjacency"] == "replace-one"
            assert math.isclose(cell["privacy"]["epsilon"], float(epsilon), rel_tol=1e-9)
            assert _agrees(table[method][column], [float(cell["faa"])]), (method, epsilon)
            assert math.isclose(cell["faa"], bench[float(epsilon)], rel_tol=1e-12), (method, epsilon)


def test_lorms_curve_at_replace_one_quotes_its_cells():
    """PRIVACY.md's LoRM table at the replace-one calibration quotes each cell's FAA and forgetting
    (docs/results/dp-clinc150/replace-one/epsilon*/cells/lorm/), each run under replace-one at its budget, and the
    add-or-remove cell of the same budget beside it."""
    table = _privacy_table((ROOT / "docs" / "PRIVACY.md").read_text(), "| `lorm`, at replace-one | ε")
    epsilons = [h.removeprefix("ε ").strip() for h in table["`lorm`, at replace-one"]]
    assert "1" in epsilons and "8" in epsilons
    for column, epsilon in enumerate(epsilons):
        where = RESULTS_DIR / "dp-clinc150" / "replace-one" / f"epsilon{epsilon}" / "cells" / "lorm" / "beta0.5"
        cell = json.loads((where / "seed0" / "metrics.json").read_text())
        assert cell["privacy"]["adjacency"] == "replace-one" and cell["privacy"]["budget_epsilon"] == float(epsilon)
        for row, field in (("FAA", "faa"), ("forgetting", "forgetting")):
            assert _agrees(table[row][column], [float(cell[field])]), (epsilon, row)
        before = RESULTS_DIR / "dp-clinc150" / f"epsilon{epsilon}" / "cells" / "lorm" / "beta0.5" / "seed0"
        old = json.loads((before / "metrics.json").read_text())
        assert _agrees(table["FAA under add-or-remove"][column], [float(old["faa"])]), epsilon


def test_lorm_and_fedavg_lora_at_epsilon_8_at_replace_one_quote_their_cells():
    """PRIVACY.md's rerun of the two DP-SGD cells at the replace-one calibration quotes each cell's FAA and
    forgetting (docs/results/dp-clinc150/replace-one/epsilon8/cells/)."""
    table = _privacy_table((ROOT / "docs" / "PRIVACY.md").read_text(), "| method, at replace-one |")
    for method in ("lorm", "fedavg-lora"):
        cells = table[f"`{method}`"]
        where = RESULTS_DIR / "dp-clinc150" / "replace-one" / "epsilon8" / "cells" / method
        cell = json.loads((where / "beta0.5" / "seed0" / "metrics.json").read_text())
        assert cell["privacy"]["adjacency"] == "replace-one"
        assert _agrees(cells[0], [float(cell["faa"])]) and _agrees(cells[2], [float(cell["forgetting"])]), method
