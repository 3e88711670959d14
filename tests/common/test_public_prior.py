"""Public priors: the corpus is read from its package, the same texts for the same size and seed (named by their
digest), and the prior whitens the public features' top directions and reads nothing else."""

from __future__ import annotations

import pytest
import torch

from common.privacy.gaussian import clip_rows
from common.privacy.public_prior import fit_prior, load_corpus

EPS = torch.finfo(torch.float64).eps


def test_a_corpus_is_the_same_texts_for_a_size_and_seed_and_its_digest_names_them():
    a, b = load_corpus("chitchat", 500, seed=3), load_corpus("chitchat", 500, seed=3)
    assert a.texts == b.texts and a.digest == b.digest and len(a.texts) == 500
    assert len(set(a.texts)) == 500 and all(t and t == t.strip() for t in a.texts)
    assert load_corpus("chitchat", 1000, seed=3).texts[:500] == a.texts  # a larger size extends a smaller one
    other = load_corpus("chitchat", 500, seed=4)
    assert other.digest != a.digest and other.statement() == {
        "corpus": "chitchat",
        "size": 500,
        "seed": 4,
        "digest": other.digest,
    }
    with pytest.raises(ValueError, match="want one of"):
        load_corpus("clinc150", 10)
    with pytest.raises(ValueError, match="distinct utterances, not"):
        load_corpus("chitchat", 10**7)


def test_the_prior_whitens_the_public_top_directions_and_centres_them():
    g = torch.Generator().manual_seed(0)
    scales = torch.tensor([9.0, 5.0, 3.0, 1.0, 0.5, 0.1], dtype=torch.float64)
    rotation, _ = torch.linalg.qr(torch.randn(6, 6, generator=g, dtype=torch.float64))
    public = (torch.randn(4000, 6, generator=g, dtype=torch.float64) * scales) @ rotation.T + 7.0
    prior = fit_prior(public, 3, shrink=0.0)
    z = prior.apply(public)
    assert prior.width == 3 and z.shape == (4000, 3)
    tol = 1e3 * EPS * float(public.abs().max()) ** 2
    assert torch.allclose(z.mean(0), torch.zeros(3, dtype=torch.float64), atol=tol)
    assert torch.allclose(torch.cov(z.T), torch.eye(3, dtype=torch.float64), atol=1e6 * EPS)  # exactly white
    # the kept directions are the top three of the public covariance: the smallest ones are left out
    kept = prior.basis / prior.basis.norm(dim=0)
    assert float((kept.T @ rotation[:, 3:]).abs().max()) < 0.1
    # shrinkage toward the mean eigenvalue keeps the order of the variances and their ratios below one
    shrunk = torch.cov(fit_prior(public, 3, shrink=1.0).apply(public).T).diagonal()
    assert bool((shrunk < 1).all()) and bool((shrunk[:-1] >= shrunk[1:]).all())


def test_the_clip_after_the_prior_still_bounds_every_record():
    g = torch.Generator().manual_seed(1)
    public, private = torch.randn(300, 8, generator=g, dtype=torch.float64), 50 * torch.randn(40, 8, generator=g)
    rows = clip_rows(fit_prior(public, 4, shrink=0.5).apply(private), 1.0)
    assert float(rows.norm(dim=1).max()) <= 1.0 + 8 * EPS


def test_the_prior_refuses_what_it_cannot_fit():
    public = torch.zeros(10, 4, dtype=torch.float64)
    for k, shrink, rows in ((0, 1.0, public), (5, 1.0, public), (2, -1.0, public), (2, 1.0, public[:1])):
        with pytest.raises(ValueError, match="public prior"):
            fit_prior(rows, k, shrink)
