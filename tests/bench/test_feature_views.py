"""bench/feature_views.py: the chunked, weighted sums the dropout-view sweep fits on are the
Gram and class sums of the projected features, each row counted ``weight`` times."""

from __future__ import annotations

import torch

from tolerance import assert_close_to_dtype


def test_chunked_sums_are_the_weighted_gram_and_class_sums(fv, monkeypatch):
    monkeypatch.setattr(fv, "CHUNK", 7)  # several chunks, the last one short
    g = torch.Generator().manual_seed(3)
    x = torch.randn(30, 12, generator=g, dtype=fv.DTYPE)
    y = torch.randint(0, 4, (30,), generator=g)
    fmap = fv.FeatureMap(x, fv.Recipe.parse("1:mean:ln:rp20"), 0)
    gram, class_sum = fv.chunked_sums(fmap, x, y, 4, 0.5)
    phi = fmap(x)
    one_hot = torch.nn.functional.one_hot(y, 4).to(fv.DTYPE)
    assert_close_to_dtype(gram, 0.5 * phi.T @ phi, fv.DTYPE, terms=30)
    assert_close_to_dtype(class_sum, 0.5 * one_hot.T @ phi, fv.DTYPE, terms=30)
