"""Every method on Flower's simulation engine is the in-process engine's run, bit for bit: each method's tiny run
(the fingerprints' configuration) exported by both engines, every tensor of every exported file equal, and the
accuracy counts equal. A slow test (about 20 s a method): the default suite runs LoRM, ridge and the hostile
node on Flower (test_simulation.py); every method's merges are the coordinator's own, which the fingerprints pin."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

pytest.importorskip("flwr")

from common.run.config import RunConfig  # noqa: E402
from engine.simulation import run_inprocess  # noqa: E402
from flower.simulation import simulate  # noqa: E402
from server.strategies import STRATEGIES  # noqa: E402

from fingerprints import TINY, TINY_SETTINGS  # noqa: E402
from own_data import assert_same_tensors  # noqa: E402

pytestmark = pytest.mark.slow


def exported(results: Path) -> list[Path]:
    """Every safetensors file under ``results``, by its path relative to it."""
    return sorted(f.relative_to(results) for f in results.rglob("*.safetensors"))


@pytest.mark.parametrize("method", sorted(STRATEGIES))
def test_every_method_on_flower_exports_the_in_process_runs_tensors_and_counts(method: str, tmp_path: Path) -> None:
    config = RunConfig(run_id=f"flower-{method}", method=method, **{**TINY, "settings": TINY_SETTINGS.get(method, {})})
    native, flower = tmp_path / "in-process", tmp_path / "flower"
    run_inprocess(config, results_dir=native)
    simulate(config, {"results-dir": str(flower)})
    files = exported(native)
    assert files and exported(flower) == files
    for name in files:
        assert_same_tensors(native / name, flower / name)
    want_metrics, got_metrics = (json.loads((d / "metrics.json").read_text()) for d in (native, flower))
    assert got_metrics["correct"] == want_metrics["correct"] and got_metrics["total"] == want_metrics["total"]
