"""bench/serve_load.py at toy size: the export it makes is one lorm-serve takes, its callers are all answered,
and the batches the server ran are the requests' (tiny-bert; CLINC150's sentences, skipped without them)."""

from __future__ import annotations

import importlib.util
import json
import os
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "bench" / "serve_load.py"
DATA = Path(os.environ.get("LORM_DATA_DIR", Path(__file__).resolve().parents[3] / "shared" / "datasets"))


def load_bench():
    spec = importlib.util.spec_from_file_location("serve_load", BENCH)
    assert spec is not None and spec.loader is not None
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


@pytest.mark.long(14)
@pytest.mark.skipif(not (DATA / "clinc150" / "data_full.json").is_file(), reason="needs CLINC150's sentences")
# the cell's export is a real run with Grams of four 10,000-wide blocks: 85 s of the default suite's CI time, so slow
# (its scoring is checked in the default suite at toy width by tests/serve/test_every_method.py)
@pytest.mark.parametrize("cell", [None, pytest.param("ridge@3layers+valx4avg", marks=pytest.mark.slow)])
def test_the_load_benchmark_runs_and_counts_every_answer(capsys, cell):
    """The LoRM-shaped synthetic export, and a real run's export of the best MiniLM recipe's scoring (shrunk to
    tiny-bert and one sentence per intent): every phase measured, every caller answered, the export's size told."""
    bench = load_bench()
    argv = [
        *(["--cell", cell, "--per-class", "1"] if cell else []),
        "--backbone",
        "tiny-bert",
        "--rounds",
        "1",
        "--seconds",
        "1",
        "--warmup",
        "0.5",
        "--clients",
        "6",
        "--batch",
        "4",
    ]
    assert bench.main([*argv, "--threads", "1", "--data-dir", str(DATA), "--json"]) == 0
    result = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert result["errors"] == 0 and result["served_per_s"] > 0 and result["tls"]
    assert 1 <= result["mean_batch"] <= 4  # the server's --max-batch is the benchmark's batch
    assert len(result["per_round"]) == 1 and all(v > 0 for r in result["per_round"] for v in r.values())
    assert set(result["per_round"][0]) == {"backbone", "score", "tokenise+score", "served"}
    files = result["export"]["bytes"]
    assert files["total"] == sum(v for k, v in files.items() if k != "total") and files["model.json"] > 0
    if cell:
        assert result["export"]["method"] == "ridge" and files["scoring.safetensors"] > 150 * 40_000 * 4
