"""Do dropout views of the training utterances help the frozen closed-form head? (a sweep outside the engine)

Each training (and ``val``) utterance is encoded once as the system encodes it (dropout off) and ``--views V``
more times with the encoder's own dropout on (MiniLM's 0.1 on attention and hidden states; view ``v`` seeded
``1000 + v``). The ridge head of ``bench/feature_heads.py``'s recipe (layers, mean pooling, per-sample layer
norm, one seeded random projection + ReLU) is fitted on the clean features and every view, each view a
sample of its own with its utterance's label, weighted ``--weight`` against the clean one; test
utterances are encoded once, dropout off, as in the system. This is data augmentation in feature space:
the Gram and class sums stay sums over samples, so the head stays exact under any split of the
utterances over clients (a client adds its own views' rows), at V + 1 times the features step's
encoder passes and no more bytes (the Gram factor is ``min(n, F') x F'``, with n over F' already).

lambda is chosen as the system chooses it: the head fitted without the utterances of global training
index i % 5 == 0 (all their views left out too) is scored by squared error on their clean features;
the decade grid, then half a decade each side. The test split is used for the printed accuracy only.

Run: .venv/bin/python bench/feature_views.py --views 0 2 4 --fit train+val
     (clean features from feature_heads.py's cache; views cached beside them, ~4 min each on 2 cores)
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from feature_heads import (  # noqa: E402
    DTYPE,
    LAMBDAS,
    SPLITS,
    FeatureMap,
    Recipe,
    _acc,
    add_data_arguments,
    cached_features,
    features,
    load_clinc,
    pooled_states,
    search,
)

from server.strategies.closed_form import ridge_head, squared_error  # noqa: E402

CHUNK = 4096  # rows of projected features held at once


def cached_view(texts: list[str], cache: Path, split: str, max_length: int, view: int) -> np.ndarray:
    file = cache / f"clinc150-minilm-len{max_length}-{split}-dropout{view}.npz"
    if not file.exists():
        t0 = time.perf_counter()
        mean = pooled_states(texts, max_length, dropout_seed=1000 + view)["mean"]
        cache.mkdir(parents=True, exist_ok=True)
        np.savez(file, mean=mean)
        print(f"extracted {split} view {view}: {len(texts)} utterances, {time.perf_counter() - t0:.0f} s", flush=True)
    with np.load(file) as f:
        return f["mean"]


def chunked_sums(fmap: FeatureMap, x: Tensor, y: Tensor, classes: int, weight: float) -> tuple[Tensor, Tensor]:
    """``weight`` times the Gram and class sums of ``fmap(x)``, a chunk of rows at a time."""
    width = fmap.p.shape[0] if fmap.p is not None else x.shape[1]
    gram = torch.zeros(width, width, dtype=DTYPE)
    class_sum = torch.zeros(classes, width, dtype=DTYPE)
    for start in range(0, len(x), CHUNK):
        phi = fmap(x[start : start + CHUNK])
        gram.addmm_(phi.T, phi, alpha=weight)
        class_sum.index_add_(0, y[start : start + CHUNK], phi, alpha=weight)
    return gram, class_sum


def run(
    views: int,
    weight: float,
    recipe: Recipe,
    clean: dict,
    dropped: dict,
    labels: dict,
    fit_splits: tuple[str, ...],
    seed: int,
) -> dict:
    """Fit on the clean features plus ``views`` dropout views; lambda by the held-out rule; test accuracy."""
    t0 = time.perf_counter()
    classes = int(labels["train"].max()) + 1
    x = torch.cat([features(clean[s], recipe) for s in fit_splits])
    y = torch.cat([torch.from_numpy(labels[s]) for s in fit_splits])
    extra = [
        torch.cat([features({"mean": dropped[s][v]}, recipe) for s in fit_splits]) for v in range(views)
    ]  # each (n, F), aligned with x
    held = torch.arange(len(y)) % 5 == 0
    fmap = FeatureMap(x, recipe, seed)  # ln features: no statistics, the map depends on the seed alone
    g_fit, s_fit = chunked_sums(fmap, x[~held], y[~held], classes, 1.0)
    g_held, s_held = chunked_sums(fmap, x[held], y[held], classes, 1.0)
    for view in extra:
        g, s = chunked_sums(fmap, view[~held], y[~held], classes, weight)
        g_fit += g
        s_fit += s
        g, s = chunked_sums(fmap, view[held], y[held], classes, weight)
        g_held += g
        s_held += s
        del g, s
    sel_phi = fmap(x[held])
    sel_gram, sel_sum, sel_y = sel_phi.T @ sel_phi, torch.zeros(classes, sel_phi.shape[1], dtype=DTYPE), y[held]
    sel_sum.index_add_(0, sel_y, sel_phi)
    sel_counts = torch.bincount(sel_y, minlength=classes).to(DTYPE)

    def score(lam: float) -> tuple[float, float]:
        head = ridge_head(g_fit, s_fit, lam)
        return squared_error(head, sel_gram, sel_sum, sel_counts), _acc(sel_phi @ head.T, sel_y)

    lam, scores = search(LAMBDAS, score)  # the decade grid, then half a decade each side
    head = ridge_head(g_fit + g_held, s_fit + s_held, lam)
    test_x = features(clean["test"], recipe)
    test = _acc(fmap(test_x) @ head.T, torch.from_numpy(labels["test"]))
    return {
        "views": views,
        "weight": weight,
        "lambda": lam,
        "select_acc": scores[lam][1],
        "test": test,
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="3456:mean:ln:rp10000", help="feature_heads.py's LAYERS:mean:NORM:rpN")
    parser.add_argument("--views", type=int, nargs="+", default=[0, 2])
    parser.add_argument("--weight", type=float, default=1.0, help="each view's weight against the clean sample")
    parser.add_argument("--fit", choices=("train", "train+val"), default="train+val")
    add_data_arguments(parser)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = Recipe.parse(args.recipe)
    finite = 0 < recipe.rp < float("inf")
    if recipe.pool != "mean" or recipe.norm == "std" or recipe.members != 1 or recipe.kernel != "arccos" or not finite:
        # std's statistics would be taken over the held-out utterances too: ln and raw need none
        parser.error("--recipe: LAYERS:mean:ln|raw:rpN (one finite ReLU projection)")
    data = load_clinc(Path(args.data_dir))
    clean = cached_features(data, Path(args.cache), args.max_length)
    fit_splits = ("train", "val") if args.fit == "train+val" else ("train",)
    most = max(args.views)
    dropped = {
        s: [cached_view(data[s][0], Path(args.cache), s, args.max_length, v) for v in range(most)] for s in fit_splits
    }
    labels = {s: data[s][1] for s in SPLITS}
    print(f"{'recipe':24s} {'views':>5s} {'weight':>6s} {'lambda':>9s} {'sel acc':>7s} {'test':>6s} {'s':>5s}")
    for views in args.views:
        r = run(views, args.weight, recipe, clean, dropped, labels, fit_splits, args.seed)
        print(
            f"{args.recipe:24s} {r['views']:5d} {r['weight']:6g} {r['lambda']:9.3g} {r['select_acc']:7.2f} "
            f"{r['test']:6.2f} {r['seconds']:5.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
