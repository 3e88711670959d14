"""The front doors hold what the cells hold: RESULTS.md's summary and cost tables are regenerated from the
committed cells and compared, README's "which method to use" figures are checked against the same cells, README
stays short enough to read at once, and every relative link in the docs resolves (the figures RESULTS.md quotes
by hand: tests/test_results_figures.py)."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from lab import cost_table, results_summary, summary_plots, summary_table
from lab.rows import load_cells

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def full_cells() -> list[dict]:
    return load_cells(summary_table.FULL)


def _cell(method: str, beta: float, seed: int, faa: float, gpu: str = "none", rss: float | None = 2e9) -> dict:
    cell = {
        "method": method,
        "beta": beta,
        "seed": seed,
        "faa": faa,
        "bytes_per_client": 42.3e6,
        "machine": {"system": "Linux", "cpu": "cpu", "cores": 2, "usable_cores": 2, "gpu": gpu}
        | {"python": "3", "torch": "2"},
        "code": {"commit": "abcdef0123", "changed": False},
    }
    if rss is not None:
        cell["peak_rss_bytes"] = rss
    return cell


def test_summary_shows_mean_std_seeds_and_gaps():
    cells = [_cell("lorm", 0.5, s, faa) for s, faa in enumerate((83.42, 83.24, 84.36))]
    cells += [_cell("ridge", 0.5, 0, 95.18, rss=None), _cell("ridge", 1.0, 0, 95.18, rss=None)]
    table = summary_table.summary(cells)
    assert "| `lorm` | — | 83.67 ± 0.60 | — | — / 3 / — | **42.3** | **2.0** | — / A / — | `abcdef0` |" in table
    # The best FAA per column is bold, a beta nobody ran is "—", unlogged memory is "—".
    assert "| `ridge` | **95.18** | **95.18** | — | 1 / 1 / — | **42.3** | — | A / A / — | `abcdef0` |" in table


def test_memory_of_a_gpu_host_is_never_the_best():
    cells = [_cell("pilora", 0.5, 0, 90.0, gpu="H100", rss=1e9), _cell("lorm", 0.5, 0, 83.0, rss=3e9)]
    table = summary_table.summary(cells)
    assert "| `pilora` | — | **90.00** | — | — / 1 / — | **42.3** | 1.0 (GPU host) |" in table
    assert "| `lorm` | — | 83.00 | — | — / 1 / — | **42.3** | **3.0** |" in table


def test_memory_is_the_hosts_without_a_gpu_where_they_logged_it():
    """A GPU host's resident set holds the CUDA runtime: a row with cells on both kinds of host gives the most of
    its cells without a GPU (here below the GPU host's), saying how many of the row's cells that covers."""
    cells = [_cell("ccvr", b, 0, 90.0, rss=2.9e9) for b in (1.0, 0.2)]
    cells += [_cell("ccvr", 0.5, s, 89.0 + 2 * s, gpu="H200", rss=3.4e9) for s in range(2)]
    table = summary_table.summary(cells)
    assert "| `ccvr` | **90.00** | **90.00 ± 1.41** | **90.00** | 1 / 2 / 1 | **42.3** | 2.9 (2 of 4 cells) |" in table


def test_the_frontier_keeps_what_nothing_beats_on_bytes_and_faa():
    points = {
        "ncm": (0.5, 91.6),
        "pilora": (8.8, 90.0),
        "ridge": (84.0, 95.2),
        "joint": (8.5, 96.3),
        "big": (800, 97.7),
    }
    assert summary_plots.frontier(points) == ["ncm", "ridge", "big"]


def test_the_plots_are_drawn(tmp_path):
    cells = [_cell("lorm", b, s, 80.0 + s) for b in summary_table.BETAS for s in range(2)]
    cells += [_cell("ridge", 0.5, 0, 95.0)]
    summary_plots.plot_faa(cells, tmp_path / "faa.png")
    summary_plots.plot_bytes(cells, tmp_path / "bytes.png")
    assert (tmp_path / "faa.png").stat().st_size > 1000 and (tmp_path / "bytes.png").stat().st_size > 1000


def _costed(
    method: str, machine: str, threads: int = 1, resumes: int = 0, rss: float | None = 2.5e9, gpu: str = "none"
) -> dict:
    cell = _cell(method, 0.5, 0, 80.0, gpu=gpu, rss=rss)
    cell["machine"] = cell["machine"] | {"cpu": machine}
    cell |= {"config": {"threads": threads}, "wall_seconds": 600.0, "seconds": 1200.0, "mode": "inprocess"}
    return cell | ({"resumes": resumes} if resumes else {})


def test_costs_name_each_cells_time_memory_host_and_group():
    sets = {
        "clinc150-full": [_costed("lorm", "epyc", rss=None), _costed("ridge", "xeon", threads=2)],
        "clinc150-full-rerun": [_costed("lorm", "epyc", resumes=1), _costed("lorm", "other", gpu="H100")],
    }
    table = cost_table.costs(sets)
    assert "| `lorm` | 0.5 | 0 | 10.0 | not logged | A | 1 | not recorded | within A, 1 thread |" in table
    assert "| `ridge` | 0.5 | 0 | 10.0 | 2.50 | B | 2 | not recorded | within B, 2 threads |" in table
    # A resumed cell's time is its parts' summed computing time, compared with nothing; its memory its last part's.
    rerun = "| `lorm` (clinc150-full-rerun) | 0.5 | 0 | 20.0 | 2.50 (last part) | A | 1 | not recorded "
    assert rerun + "| no: 2 parts summed |" in table
    # A host the summary does not name is listed under the table, after the summary's letters.
    assert "Hosts A and B: as in the summary." in table and "- Host C: Linux, other, 2 CPU cores" in table
    assert "times of different hosts never compare (host C has a GPU)" in table
    assert "logged by 3 of the 4 cells that ran (those run before the log began have none)." in table
    # once every cell has its peak, the sentence says so and no longer speaks of cells without one
    sets["clinc150-full"][0] = _costed("lorm", "epyc")
    table = cost_table.costs(sets)
    assert "logged by every one of the 4 cells that ran. What else" in table and "not logged" not in table


def test_a_committed_host_keeps_its_letter_when_cells_of_a_new_host_come():
    old = [_costed("lorm", "epyc"), _costed("ridge", "xeon")]
    order = list(summary_table.hosts(old))  # what hosts.json holds: epyc A, xeon B
    # A new host with a GPU sorts first among new ones; committed hosts keep A and B all the same.
    new = [*old, _costed("ccvr", "h200", gpu="H200")]
    letters = summary_table.hosts(new, order)
    assert list(letters.values()) == ["A", "B", "C"] and "h200" in next(reversed(letters))
    assert list(summary_table.hosts(new).values()) == ["A", "B", "C"]  # without the order, the GPU would come first
    assert "h200" in next(iter(summary_table.hosts(new)))
    table = summary_table.summary(new, order)
    assert "| `ccvr` | — | **80.00** | — | — / 1 / — | **42.3** | 2.5 (GPU host) | — / C / — |" in table
    assert "| `lorm` | — | **80.00** | — | — / 1 / — | **42.3** | **2.5** | — / A / — |" in table
    assert "- Host C: Linux, h200," in table
    # A committed host these cells do not name keeps its letter too: only ridge's host, B, is named.
    alone = summary_table.summary([old[1]], order)
    assert "| `ridge` | — | **80.00** | — | — / 1 / — | **42.3** | **2.5** | — / B / — |" in alone
    assert "- Host B: Linux, xeon," in alone and "- Host A" not in alone


def test_record_hosts_appends_new_machines_and_keeps_the_old(tmp_path):
    cell = _costed("lorm", "h200", gpu="H200") | {"beta": 0.5, "seed": 0}
    folder = tmp_path / summary_table.FULL.name / "cells" / "lorm" / "beta0.5" / "seed0"
    folder.mkdir(parents=True)
    (folder / "metrics.json").write_text(json.dumps(cell))
    (tmp_path / summary_table.HOSTS).write_text(json.dumps(["an old host"]))
    results_summary.record_hosts(tmp_path)
    assert summary_table.host_order(tmp_path)[0] == "an old host"
    assert len(summary_table.host_order(tmp_path)) == 2 and "h200" in summary_table.host_order(tmp_path)[1]


def test_results_summary_and_costs_are_the_ones_the_cells_give():
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert text == results_summary.generated(text), (
        "docs/RESULTS.md differs from the cells: run python -m lab.results_summary"
    )


def test_a_cell_changed_under_the_costs_fails_the_check(tmp_path):
    results = summary_table.FULL.parent
    for path in results.glob(f"{summary_table.FULL.name}*/**/metrics.json"):
        copy = tmp_path / path.relative_to(results)
        copy.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, copy)
    shutil.copyfile(results / summary_table.HOSTS, tmp_path / summary_table.HOSTS)
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    assert results_summary.generated(text, tmp_path) == text
    metrics = tmp_path / "clinc150-full/cells/ridge@3layers/beta0.5/seed0/metrics.json"
    cell = json.loads(metrics.read_text())
    cell["wall_seconds"] += 600.0  # ten minutes more: the costs' row, not the summary, moves
    metrics.write_text(json.dumps(cell))
    lines = zip(text.splitlines(), results_summary.generated(text, tmp_path).splitlines())
    changed = [(old.split(" | "), line.split(" | ")) for old, line in lines if old != line]
    assert len(changed) == 1
    before, after = changed[0]
    assert after[:3] == before[:3] == ["| `ridge@3layers`", "0.5", "0"]
    assert float(after[3]) == round(float(before[3]) + 10.0, 1)
    assert after[4:] == before[4:]


def _readme_table() -> list[list[str]]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Which method to use\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("| `")]
    return [[cell.strip() for cell in row.strip("|").split("|")] for row in rows]


def test_readme_which_method_figures_are_the_cells(full_cells):
    rows = summary_table.by_method(full_cells)
    table = _readme_table()
    assert len(table) >= 5
    for method, *quoted in table:
        label = re.fullmatch(r"`([^`]+)`", method)
        assert label and label.group(1) in rows, f"README names {method}, which has no full-data cell"
        assert quoted[:3] == summary_table.figures(rows[label.group(1)]), label.group(1)


def test_readme_is_at_most_150_lines():
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= 150, f"README.md has {len(lines)} lines; the front door holds at most 150"


def _anchor(heading: str) -> str:
    """GitHub's anchor of a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def test_every_relative_link_in_the_docs_resolves():
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), ROOT / "docs/results/archive.md"]
    for doc in docs:
        for target, anchor in re.findall(r"\]\(([^)#\s]*)(?:#([^)\s]*))?\)", doc.read_text()):
            if "://" in target:
                continue
            path = (doc.parent / target) if target else doc
            assert path.exists(), f"{doc.relative_to(ROOT)} links to missing {target}"
            if anchor and path.suffix == ".md":
                headings = re.findall(r"^#+ (.+)$", path.read_text(), re.M)
                assert anchor in {_anchor(h) for h in headings}, f"{doc.relative_to(ROOT)} links to {target}#{anchor}"


def test_results_contents_lists_every_section():
    text = (ROOT / "docs" / "RESULTS.md").read_text()
    contents = text.split("## Contents\n", 1)[1].split("\n## ", 1)[0]
    listed = re.findall(r"\]\(#([^)]+)\)", contents)
    headings = [h for h in re.findall(r"^#{2,3} (.+)$", text, re.M) if h not in ("Contents",)]
    assert listed == [_anchor(h) for h in headings if not h.startswith("Summary")]


def test_the_hosts_keep_the_letters_the_prose_quotes():
    """RESULTS' prose names hosts by letter (host B: the 2-core EPYC where most cells ran): hosts.json holds them."""
    order = summary_table.host_order()
    assert "H100" in order[0] and "AMD EPYC" in order[1] and "H200" in order[3]
    assert "Xeon" in order[2] and "2 CPU cores" in order[2] and "GPU: none" in order[2]
