"""Do the utterances' own words add to MiniLM's features under the closed-form head? (a diagnostic)

The ridge of infinite width (``bench/feature_heads.py``'s ``rpinf``: the arc-cosine kernel, the limit of a
random ReLU projection) on each utterance's frozen MiniLM features side by side with its words: word
n-grams (1 to ``--ngrams``, lower-cased, split on white space) counted into ``2^20`` buckets by a fixed
hash (CRC-32, a second bit giving the sign, so collisions cancel on average), the count vector scaled to
length ``w sqrt(F)`` (``F`` the width of the MiniLM features, whose per-sample layer norm gives them length
``sqrt(F)``): ``w`` weighs the words against MiniLM, ``w = 0`` is ``feature_heads.py``'s recipe itself.
Every feature is a function of its utterance alone (a hash, no vocabulary, no statistics), so a system
that projected ``[z, w h]`` at random would keep the head exact under any split of the data.

lambda and ``w`` are chosen on training data only: the head fitted without the samples of global index
i % 5 == 0 is scored on them by squared error (one eigendecomposition per ``w``). The test split is used
for the printed accuracy only.

Run: .venv/bin/python bench/lexical_heads.py --recipe 3456:mean:ln:rpinf --weights 0 0.5 1 --fit train+val
"""

from __future__ import annotations

import argparse
import math
import sys
import time
import warnings
import zlib
from pathlib import Path

import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from feature_heads import (  # noqa: E402
    DTYPE,
    ROWS,
    SPLITS,
    Recipe,
    _dual,
    _kernel_lambda,
    add_data_arguments,
    arccos_from_dots,
    cached_features,
    features,
    load_clinc,
)

BUCKETS = 2**20


def ngram_counts(texts: list[str], longest: int) -> Tensor:
    """``(n, BUCKETS)`` sparse COO, float64: each text's signed hashed word n-gram counts, rows of length 1."""
    rows, cols, vals = [], [], []
    for i, text in enumerate(texts):
        words = text.lower().split()
        counts: dict[int, float] = {}
        for n in range(1, longest + 1):
            for start in range(len(words) - n + 1):
                code = zlib.crc32(" ".join(words[start : start + n]).encode())
                bucket, sign = code % BUCKETS, 1.0 if (code >> 31) & 1 else -1.0
                counts[bucket] = counts.get(bucket, 0.0) + sign
        norm = math.sqrt(sum(v * v for v in counts.values())) or 1.0
        for bucket, value in counts.items():
            rows.append(i)
            cols.append(bucket)
            vals.append(value / norm)
    indices = torch.tensor([rows, cols], dtype=torch.int64)
    coo = torch.sparse_coo_tensor(
        indices, torch.tensor(vals, dtype=DTYPE), (len(texts), BUCKETS), check_invariants=True
    )
    return coo.coalesce()


def sparse_dots(a: Tensor, bt: Tensor) -> Tensor:
    """``a bt``, dense, for sparse COO rows ``a`` and a coalesced sparse ``bt`` (the other rows, transposed)."""
    with warnings.catch_warnings():  # sparse.mm goes through CSR, "in beta"; tests check it against dense
        warnings.filterwarnings("ignore", message="Sparse CSR tensor support is in beta")
        return torch.sparse.mm(a, bt).to_dense()


class Joint:
    """``[z, w h]``: MiniLM features ``z (n, F)`` and the word vectors ``h`` (sparse COO rows of length 1)."""

    def __init__(self, z: Tensor, h: Tensor, weight: float) -> None:
        self.z, self.h, self.weight = z, h, weight
        self.scale = weight * math.sqrt(z.shape[1])

    def rows(self, index: Tensor) -> Joint:
        return Joint(self.z[index], self.h.index_select(0, index).coalesce(), self.weight)

    def norms(self) -> Tensor:
        squares = torch.zeros(self.h.shape[0], dtype=DTYPE).index_add_(0, self.h.indices()[0], self.h.values().pow(2))
        return (self.z.pow(2).sum(1) + self.scale**2 * squares).sqrt()

    def kernel(self, other: Joint) -> Tensor:
        """``ROWS`` rows at a time, so the elementwise temporaries stay a few hundred MB."""
        out = torch.empty(len(self.z), len(other.z), dtype=DTYPE)
        na, nb = self.norms(), other.norms()
        bt = other.h.t().coalesce()
        for start in range(0, len(self.z), ROWS):
            stop = min(start + ROWS, len(self.z))
            dots = self.z[start:stop] @ other.z.T
            if self.scale:
                dots.add_(sparse_dots(self.h.index_select(0, torch.arange(start, stop)), bt), alpha=self.scale**2)
            out[start:stop] = arccos_from_dots(dots, na[start:stop], nb)
        return out


def evaluate(weight: float, z: dict, h: dict, y: dict, classes: int) -> dict:
    t0 = time.perf_counter()
    train = Joint(z["train"], h["train"], weight)
    held = torch.arange(len(y["train"])) % 5 == 0
    fit_i, sel_i = (~held).nonzero().squeeze(1), held.nonzero().squeeze(1)
    lam, scores = _kernel_lambda(  # one eigendecomposition serves every lambda
        Joint.kernel, train.rows(fit_i), y["train"][fit_i], train.rows(sel_i), y["train"][sel_i], classes
    )
    alpha = _dual(train.kernel(train), torch.nn.functional.one_hot(y["train"], classes).to(DTYPE), lam)
    test = (Joint(z["test"], h["test"], weight).kernel(train) @ alpha).argmax(1)
    return {
        "weight": weight,
        "lambda": lam,
        "select_err": scores[lam][0],
        "select_acc": scores[lam][1],
        "test": 100.0 * float((test == y["test"]).to(DTYPE).mean()),
        "seconds": time.perf_counter() - t0,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipe", default="3456:mean:ln:rpinf", help="feature_heads.py's LAYERS:POOL:NORM:rpinf")
    parser.add_argument("--weights", type=float, nargs="+", default=[0.0, 0.5, 1.0])
    parser.add_argument("--ngrams", type=int, default=2, help="word n-grams of 1 to this many words")
    parser.add_argument("--fit", choices=("train", "train+val"), default="train+val")
    add_data_arguments(parser)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipe = Recipe.parse(args.recipe)
    if recipe.kernel != "arccos" or not math.isinf(recipe.rp) or recipe.norm == "std":
        parser.error("--recipe: LAYERS:POOL:ln|raw:rpinf (the arc-cosine kernel; std is not applied here)")
    data = load_clinc(Path(args.data_dir))
    feats = cached_features(data, Path(args.cache), args.max_length)
    z = {s: features(feats[s], recipe) for s in SPLITS}
    h = {s: ngram_counts(data[s][0], args.ngrams) for s in SPLITS}
    y = {s: torch.from_numpy(data[s][1]) for s in SPLITS}
    if args.fit == "train+val":
        z["train"], y["train"] = torch.cat([z["train"], z["val"]]), torch.cat([y["train"], y["val"]])
        h["train"] = torch.cat([h["train"], h["val"]]).coalesce()
    classes = int(y["train"].max()) + 1
    print(
        f"{'recipe':22s} {'ngrams':>6s} {'w':>5s} {'lambda':>9s} {'sel err':>9s} {'sel acc':>7s} {'test':>6s} {'s':>5s}"
    )
    for weight in args.weights:
        r = evaluate(weight, z, h, y, classes)
        print(
            f"{args.recipe:22s} {args.ngrams:6d} {weight:5g} {r['lambda']:9.3g} {r['select_err']:9.2f} "
            f"{r['select_acc']:7.2f} {r['test']:6.2f} {r['seconds']:5.0f}",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
