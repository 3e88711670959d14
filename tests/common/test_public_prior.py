"""Public priors: the corpus is read from its package, the same texts for the same size and seed (named by their
digest), and the prior whitens the public features' top directions and reads nothing else."""

from __future__ import annotations

import pytest
import torch
from safetensors.torch import save

from common.methods.closed_form import NcmSettings, RidgeSettings
from common.privacy.gaussian import clip_rows
from common.privacy.public_prior import (
    PRIOR_BASIS,
    PRIOR_MEAN,
    fit_prior,
    load_corpus,
    prior_digest,
    read_prior,
    received_prior,
    write_prior,
)

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


def small_prior(seed: int = 0, width: int = 6, k: int = 3):
    g = torch.Generator().manual_seed(seed)
    return fit_prior(torch.randn(200, width, generator=g, dtype=torch.float64), k, shrink=1.0)


def test_a_prior_file_reads_back_bit_for_bit_under_its_digest_and_refuses_any_other(tmp_path):
    prior = small_prior()
    path = tmp_path / "prior.safetensors"
    digest = write_prior(path, prior, {"corpus": "chitchat", "size": 200})
    back, statement = read_prior(path, digest)
    assert back.mean.equal(prior.mean) and back.basis.equal(prior.basis) and back.shrink == 1.0
    assert statement == {"corpus": "chitchat", "size": 200, "shrink": 1.0}
    assert digest == prior_digest(prior.mean, prior.basis) and len(digest) == 64
    flipped = prior.basis.clone()
    flipped.view(torch.int64)[0, 0] ^= 1  # one low bit of one number
    assert prior_digest(prior.mean, flipped) != digest
    with pytest.raises(ValueError, match="digest"):
        read_prior(path, prior_digest(prior.mean, flipped))  # a run that pins another prior
    # a file whose tensors were swapped under its stated digest
    other = small_prior(seed=1)
    tampered = tmp_path / "tampered.safetensors"
    tampered.write_bytes(
        save(
            {"mean": other.mean.contiguous(), "basis": other.basis.contiguous()},
            metadata={"lorm.prior": "{}", "lorm.prior_digest": digest},
        )
    )
    with pytest.raises(ValueError, match="digest"):
        read_prior(tampered)
    with pytest.raises(ValueError, match="cannot be read"):
        read_prior(tmp_path / "none.safetensors")


def test_a_client_applies_only_the_runs_prior_of_the_features_width():
    prior = small_prior()
    digest = prior_digest(prior.mean, prior.basis)
    tensors = {PRIOR_MEAN: prior.mean, PRIOR_BASIS: prior.basis}
    assert received_prior(tensors, 6, 3, digest).basis.equal(prior.basis)
    other = small_prior(seed=2)
    cases = {
        "holds none": {},
        "digest": {PRIOR_MEAN: other.mean, PRIOR_BASIS: other.basis},  # the same shapes, another prior
        "do not fit": {PRIOR_MEAN: prior.mean[:5], PRIOR_BASIS: prior.basis[:5]},
        "float64": {PRIOR_MEAN: prior.mean.float(), PRIOR_BASIS: prior.basis.float()},
        "non-finite": {PRIOR_MEAN: prior.mean, PRIOR_BASIS: prior.basis.clone().fill_(float("nan"))},
    }
    for expected, sent in cases.items():
        with pytest.raises(ValueError, match=expected):
            received_prior(sent, 6, 3, digest)
    with pytest.raises(ValueError, match="do not fit"):
        received_prior(tensors, 6, 4, digest)  # the run's k is another


def test_a_plans_prior_is_hashed_once_until_its_tensors_change(monkeypatch):
    """Every evaluation batch and every served request checks the plan's prior: the same two tensor objects are
    hashed once, and a pair written in place, or another mean beside the same basis, is checked afresh."""
    import common.privacy.public_prior as public_prior

    prior = small_prior()
    digest = prior_digest(prior.mean, prior.basis)
    mean, basis = prior.mean.clone(), prior.basis.clone()
    hashed = []
    monkeypatch.setattr(public_prior, "prior_digest", lambda m, b: hashed.append(1) or prior_digest(m, b))
    tensors = {PRIOR_MEAN: mean, PRIOR_BASIS: basis}
    for _ in range(5):
        assert received_prior(tensors, 6, 3, digest).basis is basis
    assert len(hashed) == 1
    basis[0, 0] += 1.0  # in place: the same object, another prior
    with pytest.raises(ValueError, match="digest"):
        received_prior(tensors, 6, 3, digest)
    basis[0, 0] -= 1.0  # back to the run's values: still checked again, and passes
    assert received_prior(tensors, 6, 3, digest).mean is mean
    other_mean = mean.clone()
    other_mean[1] += 1.0
    with pytest.raises(ValueError, match="digest"):
        received_prior({PRIOR_MEAN: other_mean, PRIOR_BASIS: basis}, 6, 3, digest)
    with pytest.raises(ValueError, match="do not fit"):
        received_prior(tensors, 6, 4, digest)  # checked for another k: not the answer kept for k = 3
    assert len(hashed) == 4
    assert id(basis) in public_prior._RECEIVED
    del tensors, basis
    assert all(entry[0]() is not None for entry in public_prior._RECEIVED.values())  # gone with the plan's tensors


def test_the_settings_name_a_prior_by_digest_and_width_together():
    digest = "ab" * 32
    assert NcmSettings.parse({"prior_digest": digest, "prior_k": 8}).feature_map().head_width(32) == 8
    assert RidgeSettings.parse({"prior_digest": digest, "prior_k": 8, "rp_dim": 40}).feature_map().head_width(32) == 40
    for bad in (
        {"prior_digest": digest},
        {"prior_k": 8},
        {"prior_file": "p"},
        {"prior_digest": "AB" * 32, "prior_k": 8},
    ):
        with pytest.raises(ValueError, match="name a public prior together"):
            NcmSettings.parse(bad)
