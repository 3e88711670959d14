"""bench/heldout_choices.py: its data access refuses CLINC150's test split, and its choices follow the
held-out samples. Tiny synthetic data, no CLINC150."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch


def _stub_clinc(root: Path) -> Path:
    """A data_full.json of three intents with train, val and test rows (the test texts say so)."""
    rows = {
        split: [[f"{split} utterance {i}", intent] for i, intent in enumerate(["b", "a", "c"] * 4)]
        for split in ("train", "val", "test")
    }
    (root / "clinc150").mkdir(parents=True)
    (root / "clinc150" / "data_full.json").write_text(json.dumps(rows))
    return root


def test_the_test_split_cannot_be_loaded_or_asked_for(hc, tmp_path):
    data = hc.load_training(_stub_clinc(tmp_path))
    assert list(data) == ["train", "val"]
    texts, labels = data["train"]
    assert texts[0] == "train utterance 0" and labels[:3].tolist() == [1, 0, 2]  # intents in alphabetical order
    with pytest.raises(hc.TestSplitRefused, match="never the test split"):
        data["test"]
    with pytest.raises(hc.TestSplitRefused):
        hc.TrainingOnly({"train": 1, "test": 2})  # nor can it be put in


@pytest.mark.parametrize("encoder", ["minilm", "mpnet"])
def test_features_of_the_test_split_are_never_opened(hc, fh, tmp_path, encoder):
    """With every split's cache file present, only train and val are read; the test file is unreadable (MPNet's
    files are named by its folder, as bench/feature_heads.py names them)."""
    tag = fh.encoder_tag(encoder)
    states = {"mean": np.zeros((2, 7, 4), dtype=np.float32), "cls": np.zeros((2, 7, 4), dtype=np.float32)}
    for split in ("train", "val"):
        np.savez(tmp_path / f"clinc150-{tag}-len8-{split}.npz", **states)
    (tmp_path / f"clinc150-{tag}-len8-test.npz").write_text("not an npz: opening it would fail")
    data = hc.TrainingOnly({s: ([], np.zeros(2, dtype=np.int64)) for s in ("train", "val")})
    feats = hc.training_features(data, tmp_path, 8, encoder)
    assert feats["val"]["mean"].shape == (2, 7, 4)
    with pytest.raises(hc.TestSplitRefused):
        feats["test"]


def test_gamma_cells_that_evaluated_the_test_split_are_refused(hc, tmp_path):
    def cell(gamma: float, faa: float, settings: dict) -> None:
        path = tmp_path / f"g{gamma}" / "cells" / "lorm" / "beta0.2" / "seed42"
        path.mkdir(parents=True)
        config = {"gamma_head": gamma, "settings": settings}
        metrics = {"config": config, "faa": faa, "code": {"commit": "c"}, "seconds": 1.0}
        (path / "metrics.json").write_text(json.dumps(metrics))

    cell(0.1, 70.0, {"data": {"validation": 5}})
    cell(0.5, 80.0, {"data": {"validation": 5}})
    assert hc.choose_gamma(hc.gamma_cells(tmp_path, 0.2)) == "0.5"
    cell(0.7, 90.0, {})  # scored on the test split: its figure must not choose
    with pytest.raises(hc.TestSplitRefused, match="data.validation"):
        hc.gamma_cells(tmp_path, 0.2)


def test_choose_takes_the_least_held_out_error_then_the_higher_accuracy(hc):
    options = {
        "a": hc.Candidate(1.0, 50.0, 90.0),
        "b": hc.Candidate(1.0, 40.0, 80.0),
        "c": hc.Candidate(1.0, 40.0, 85.0),
    }
    assert hc.choose(options) == "c"
    with pytest.raises(ValueError):
        hc.choose({})


def test_the_held_out_samples_pick_the_informative_features(hc, fh):
    """Two options of the same samples: features that carry the class against pure noise. The held-out rule's
    figures (fit on the samples of index i % 5 != 0, scored on the others) choose the first, and its
    held-out error is that of the two heads' averaged scores, recomputed here from the system's solve."""
    gen = torch.Generator().manual_seed(0)
    classes, n, width = 4, 200, 12
    y = torch.arange(n) % classes
    informative = torch.randn(n, width, generator=gen, dtype=fh.DTYPE) + 3.0 * torch.eye(classes, width)[y]
    noise = torch.randn(n, width, generator=gen, dtype=fh.DTYPE)
    held = torch.arange(n) % hc.HOLDOUT == 0
    recipe = fh.Recipe.parse("1:mean:raw:rp40")
    found = {}
    for name, x in (("informative", informative), ("noise", noise)):
        ridge = hc.HeldOutRidge([(x[~held], y[~held], 1.0)], (x[held], y[held]), recipe, range(2), classes)
        found[name] = ridge.chosen("average")
    assert hc.choose(found) == "informative"
    assert found["informative"].accuracy > 90.0 > 50.0 > found["noise"].accuracy

    from server.strategies.closed_form import ridge_head

    x, lam = informative, found["informative"].lam
    fmaps = [fh.FeatureMap(x[~held], recipe, seed) for seed in range(2)]
    heads = [ridge_head(*fh.sums(f(x[~held]), y[~held], classes)[:2], lam) for f in fmaps]
    out = sum(f(x[held]) @ h.T for f, h in zip(fmaps, heads)) / 2
    target = torch.nn.functional.one_hot(y[held], classes).to(fh.DTYPE)
    assert float((out - target).pow(2).sum()) == pytest.approx(found["informative"].error, rel=1e-8)
