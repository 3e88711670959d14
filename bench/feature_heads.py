"""Which frozen features make the best closed-form head on CLINC150: a sweep outside the engine.

all-MiniLM-L6-v2 (``--encoder minilm``, the default; ``mpnet``: all-mpnet-base-v2, or a local transformers
model directory), frozen, max length 64, CLINC150's 150 intents in the paper's (alphabetical) order.
Every utterance's hidden states are pooled once per layer (the embeddings are layer 0, the blocks
1..L: MiniLM's six, MPNet's twelve), mean over the attention mask and the first token, and cached. A
recipe then picks:

  layers    which layers' pooled vectors are concatenated (e.g. ``456``; ``9,10,11,12`` past layer 9)
  pool      ``mean``, ``cls`` or ``both`` (each layer's mean and first token side by side)
  norm      ``std``: standardise each dimension by the fitting samples' mean and deviation (from
            ``sum x``, ``sum x^2``: sums clients add up); ``ln``: each sample's vector of each layer
            to mean 0 and deviation 1 over its dimensions (no statistics); ``raw``: neither
  rp        width F' of the random projection + ReLU, ``max(0, z P^T)``, P with N(0, 1) entries
            seeded (0: none, the head sees z itself); ``rpoN``: P's rows orthogonal in blocks of F,
            with Gaussian lengths; ``rpinf``: the limit of infinite width, the
            ridge in its dual form on the arc-cosine kernel of Cho and Saul (order 1),
            ``k(x, y) = |x||y| (sin t + (pi - t) cos t) / 2pi``, ``t`` the angle between x and y,
            which ``max(0, z P^T)`` averages to: the ceiling of widening the projection (its
            lambda is per unit of width: width F' wants about F' times it). A diagnostic: the
            dual form needs every sample in one place, which no federated client sends;
            ``rffNgG``: random Fourier features ``sqrt(2/F') cos(z W^T sqrt(2G/F) + b)`` (Rahimi and
            Recht), W with N(0, 1) entries, b uniform on [0, 2 pi), F the width of z, whose
            products average to the Gaussian kernel ``exp(-G |x - y|^2 / F)`` (for ``ln`` features
            ``|x|^2 = F``, so G is a bandwidth relative to the features' own scale); ``rbfinf``:
            that kernel itself in the dual form, G chosen with lambda (``rbfinfgG``: G fixed);
            ``rpsinf``: the sum over the recipe's layers of each layer's own arc-cosine kernel (the limit
            of one projection per layer, their ReLU features side by side, instead of one projection of
            the layers concatenated); ``rpdinf``: the arc-cosine kernel composed with itself (the limit of
            two random ReLU layers, ``max(0, max(0, z P^T) Q^T)``, both infinitely wide)
  -ACT      (last, after a finite ``rpN``/``rpoN``, e.g. ``rp5000-tanh``) the projection's activation instead of
            ReLU: ``gelu``, ``tanh`` or ``none`` (the system's ``ridge.activation``)
  xK        (after a finite width, e.g. ``rp10000x4``) an ensemble of K heads, each on its own
            projection (seeds seed .. seed + K - 1), whose outputs are averaged: each member is an
            exact federated head (K times the bytes of one), lambda shared and chosen on the average;
            also reported: the lambda of least summed *members'* errors and its test accuracy
            (``lambda_members``, ``test_members``), the rule a coordinator holding only the Gram's
            diagonal blocks can apply

The head is ridge regression on one-hot targets, ``W = S (G + lam I)^-1`` with the Gram G and the
class sums S of the training features: exact under any split of the data over clients, so a frozen
head's FAA is the same at every beta and is its accuracy over all 150 classes (the five tasks have
equal test sets). lam is chosen on training data only: with ``--select holdout`` (the system's rule)
the head fitted without the training samples of global index i % 5 == 0 is scored on them by
squared error; with ``--select val`` it is scored on CLINC150's ``val`` split (which counts as
training data, never test). The test split is used for the printed accuracy only.

Run: .venv/bin/python bench/feature_heads.py --recipes 6:mean:std:rp5000 456:mean:std:rp10000
     (features cached under --cache; the first call extracts them, ~5 minutes on 2 cores)
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import torch
from torch import Tensor

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from client.backbones import pool_states  # noqa: E402
from client.features import ACTIVATION_FUNCTIONS, normalise_layers  # noqa: E402
from client.pretrained import MPNET, pretrained_path  # noqa: E402
from common.methods.closed_form import ACTIVATIONS  # noqa: E402
from server.strategies.closed_form import ridge_head, squared_error  # noqa: E402

SPLITS = ("train", "val", "test")
LAMBDAS = tuple(10.0**k for k in range(-1, 9))  # 0.1 .. 1e8; the best decade is then halved once
KERNEL_LAMBDAS = tuple(10.0**k for k in range(-9, 4))  # per unit of width
DTYPE = torch.float64


def parse_layers(text: str) -> tuple[int, ...]:
    """``456`` (one digit a layer) or ``9,10,11,12`` (comma-separated, for encoders of more than 9 blocks)."""
    parts = text.split(",") if "," in text else list(text)
    if not parts or not all(p.isdigit() for p in parts):
        raise ValueError(f"layers {text!r}: want digits (456) or comma-separated layer numbers (9,10,11,12)")
    return tuple(int(p) for p in parts)


def format_layers(layers: tuple[int, ...]) -> str:
    return ",".join(map(str, layers)) if max(layers) > 9 else "".join(map(str, layers))


@dataclass(frozen=True)
class Recipe:
    layers: tuple[int, ...]
    pool: str
    norm: str
    rp: float  # math.inf: the kernel itself
    orthogonal: bool = False  # rpoN: orthogonal random features
    kernel: str = "arccos"  # rp, rpo: ReLU features; rff, rbf: the Gaussian kernel; rps: per layer; rpd: deep
    gamma: float | None = None  # the Gaussian kernel's bandwidth G (None: chosen with lambda)
    members: int = 1  # xK: an ensemble of K heads on independent projections, outputs averaged
    activation: str = "relu"  # -ACT after a finite rpN / rpoN: the system's ridge.activation

    @classmethod
    def parse(cls, text: str) -> Recipe:
        """``456:mean:std:rp10000`` (``rp0`` for no projection), ``3456:mean:ln:rff10000g2``, ``...:rbfinf``."""
        layers, pool, norm, rp = text.split(":")
        form = re.fullmatch(r"(rpo|rps|rpd|rp|rff|rbf)(\d+|inf)(?:g([0-9.]+))?(?:x(\d+))?(?:-(\w+))?", rp)
        if pool not in ("mean", "cls", "both") or norm not in ("std", "ln", "raw") or form is None:
            raise ValueError(
                f"recipe {text!r}: want LAYERS:mean|cls|both:std|ln|raw:rpN|rpoN|rpinf|rffNgG|rbfinf[gG]|rpsinf|rpdinf"
            )
        kind, width_text, gamma_text, members_text, activation = form.groups()
        if activation is not None and (kind not in ("rp", "rpo") or width_text in ("inf", "0")):
            raise ValueError(f"recipe {text!r}: -ACT follows a finite random projection (rpN-ACT, rpoN-ACT)")
        if activation is not None and activation not in ACTIVATIONS:
            raise ValueError(f"recipe {text!r}: the activation is one of {list(ACTIVATIONS)}")
        members = 1 if members_text is None else int(members_text)
        if members < 1 or (members > 1 and width_text in ("inf", "0")):
            raise ValueError(f"recipe {text!r}: xK wants K >= 1 and a finite projection (rpNxK, rpoNxK, rffNgGxK)")
        gaussian = kind in ("rff", "rbf")
        valid = {
            "rp": gamma_text is None,
            "rpo": gamma_text is None and width_text != "inf",
            "rff": gamma_text is not None and width_text != "inf",
            "rbf": width_text == "inf",
            "rps": width_text == "inf" and gamma_text is None,
            "rpd": width_text == "inf" and gamma_text is None,
        }
        if not valid[kind]:
            raise ValueError(f"recipe {text!r}: want rpN, rpinf, rpoN, rffNgG, rbfinf[gG], rpsinf or rpdinf")
        width = math.inf if width_text == "inf" else int(width_text)
        gamma = None if gamma_text is None else float(gamma_text)
        kernel = "rbf" if gaussian else {"rps": "arccos-sum", "rpd": "arccos-deep"}.get(kind, "arccos")
        return cls(
            parse_layers(layers),
            pool,
            norm,
            width,
            kind == "rpo",
            kernel,
            gamma,
            members,
            activation or "relu",
        )

    def __str__(self) -> str:
        width = "inf" if math.isinf(self.rp) else str(int(self.rp))
        if self.kernel == "rbf":
            kind = "rbf" if math.isinf(self.rp) else "rff"
            bandwidth = "" if self.gamma is None else f"g{self.gamma:g}"
        elif self.kernel != "arccos":
            kind, bandwidth = {"arccos-sum": "rps", "arccos-deep": "rpd"}[self.kernel], ""
        else:
            kind, bandwidth = ("rpo" if self.orthogonal else "rp"), ""
        ensemble = f"x{self.members}" if self.members > 1 else ""
        act = "" if self.activation == "relu" else f"-{self.activation}"
        return f"{format_layers(self.layers)}:{self.pool}:{self.norm}:{kind}{width}{bandwidth}{ensemble}{act}"


def load_clinc(data_dir: Path) -> dict[str, tuple[list[str], np.ndarray]]:
    """Texts and labels of each split; labels index the intents in alphabetical order."""
    raw = json.loads((data_dir / "clinc150" / "data_full.json").read_text())
    names = sorted({intent for _, intent in raw["train"]})
    index = {name: i for i, name in enumerate(names)}
    return {s: ([t for t, _ in raw[s]], np.array([index[c] for _, c in raw[s]])) for s in SPLITS}


ENCODER_TAGS = {"minilm": "minilm", "mpnet": MPNET.folder}  # packaged encoders: name -> the cache's name


def encoder_path(encoder: str) -> str:
    """``minilm`` (all-MiniLM-L6-v2 from its PyPI package), ``mpnet`` (all-mpnet-base-v2, ``lorm-fetch-model mpnet``)
    or a local transformers model directory."""
    if encoder in ENCODER_TAGS:
        return str(pretrained_path(encoder))
    if not os.path.isdir(encoder):
        raise ValueError(f"encoder {encoder!r}: want one of {sorted(ENCODER_TAGS)} or a local model directory")
    return encoder


def encoder_tag(encoder: str) -> str:
    """The cache's name for an encoder: a packaged one's, or a directory's last component."""
    return ENCODER_TAGS.get(encoder) or Path(encoder).resolve().name


@torch.no_grad()
def pooled_states(
    texts: list[str],
    max_length: int,
    batch: int = 128,
    dropout_seed: int | None = None,
    encoder: str = "minilm",
    by_length: bool = False,
) -> dict[str, np.ndarray]:
    """``mean`` and ``cls``: ``(n, L + 1, d)`` float32, per layer (the embeddings, then each block; MiniLM: 7 x 384).
    With ``dropout_seed`` the encoder's own dropout is on (torch's generator seeded with it first): a dropout view
    of the texts. ``by_length``: batches of texts of similar token counts (rows still in ``texts``' order), half
    the padding of CLINC150's batches in file order; the pooled vectors are the same up to float rounding."""
    from transformers import AutoModel, AutoTokenizer

    path = encoder_path(encoder)
    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModel.from_pretrained(path).eval()
    if dropout_seed is not None:
        model.train()  # dropout on; no gradients are taken
        torch.manual_seed(dropout_seed)
    order = np.arange(len(texts))
    if by_length:
        lengths = [len(ids) for ids in tokenizer(texts, truncation=True, max_length=max_length)["input_ids"]]
        order = np.argsort(lengths, kind="stable")
    means, firsts = [], []
    for start in range(0, len(texts), batch):
        enc = tokenizer(
            [texts[i] for i in order[start : start + batch]],
            padding=True,
            truncation=True,
            max_length=max_length,
            return_tensors="pt",
        )
        hidden = model(**enc, output_hidden_states=True).hidden_states  # (L + 1) x (b, T, d)
        every = range(len(hidden))
        means.append(pool_states(hidden, every, "mean", enc["attention_mask"]).numpy())  # as the system pools
        firsts.append(pool_states(hidden, every, "first").numpy())
    rows = np.argsort(order)  # texts' order
    return {"mean": np.concatenate(means)[rows], "cls": np.concatenate(firsts)[rows]}


def cached_features(
    data: dict,
    cache: Path,
    max_length: int,
    encoder: str = "minilm",
    by_length: bool = False,
    splits: tuple[str, ...] = SPLITS,
) -> dict[str, dict[str, np.ndarray]]:
    """Each of ``splits``' :func:`pooled_states`, extracted once into ``cache`` (``by_length``: files of their own,
    ``-bylen``)."""
    out = {}
    tag = "-bylen" if by_length else ""
    for split in splits:
        file = cache / f"clinc150-{encoder_tag(encoder)}-len{max_length}{tag}-{split}.npz"
        if not file.exists():
            t0 = time.perf_counter()
            states = pooled_states(data[split][0], max_length, encoder=encoder, by_length=by_length)
            cache.mkdir(parents=True, exist_ok=True)
            # numpy's stub types **kwds as ArrayLike but lists allow_pickle: bool among the keywords, so mypy
            # matches a dict[str, ndarray] against it too
            np.savez(file, **states)  # type: ignore[arg-type]
            print(f"extracted {split}: {len(data[split][0])} utterances, {time.perf_counter() - t0:.0f} s", flush=True)
        with np.load(file) as f:
            out[split] = {k: f[k] for k in f.files}
    return out


def features(states: dict[str, np.ndarray], recipe: Recipe) -> Tensor:
    """``(n, F)``: the recipe's layers' pooled vectors side by side, float64 (``ln``: each normalised)."""
    pools = ("mean", "cls") if recipe.pool == "both" else (recipe.pool,)
    x = torch.cat([torch.from_numpy(states[p][:, list(recipe.layers)]) for p in pools], 1).to(DTYPE)  # (n, ., d)
    if recipe.norm == "ln":
        x = normalise_layers(x)  # the system's ncm/ridge norm=layer
    return x.reshape(x.shape[0], -1)


def orthogonal_rows(rows: int, dim: int, gen: torch.Generator) -> Tensor:
    """``(rows, dim)``: blocks of ``dim`` orthogonal directions, each row's length drawn as a Gaussian
    vector's (chi, ``dim`` degrees): every row is distributed as N(0, I), rows of a block are orthogonal
    (Yu et al. 2016, orthogonal random features: a lower-variance estimate of the same kernel)."""
    blocks = []
    for start in range(0, rows, dim):
        q, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=DTYPE))
        lengths = torch.randn(dim, dim, generator=gen, dtype=DTYPE).norm(dim=1)
        blocks.append((lengths[:, None] * q.T)[: rows - start])
    return torch.cat(blocks)


class FeatureMap:
    """z = (x - mu) / sigma from the fitting samples' sums (or z = x), then f(z P^T) (f ReLU unless the recipe names
    another activation), cos(z P^T + b) for random Fourier features, or z."""

    def __init__(self, x_fit: Tensor, recipe: Recipe, seed: int) -> None:
        n = x_fit.shape[0]
        self.mu = x_fit.sum(0) / n if recipe.norm == "std" else None
        if self.mu is not None:
            var = (x_fit.pow(2).sum(0) / n - self.mu.pow(2)).clamp_min(0)
            self.sigma = var.sqrt().clamp_min(torch.finfo(DTYPE).eps)
        gen = torch.Generator().manual_seed(seed)
        width, dim = (0 if math.isinf(recipe.rp) else int(recipe.rp)), x_fit.shape[1]  # the kernel: no projection
        self.p: Tensor | None = None
        self.phase: Tensor | None = None  # random Fourier features: cos(z P^T + b)
        self.activation = ACTIVATION_FUNCTIONS[recipe.activation]
        if width:
            draw = orthogonal_rows if recipe.orthogonal else lambda r, d, g: torch.randn(r, d, generator=g, dtype=DTYPE)
            self.p = draw(width, dim, gen)
            if recipe.kernel == "rbf":
                assert recipe.gamma is not None
                self.p *= math.sqrt(2.0 * recipe.gamma / dim)
                self.phase = 2 * torch.pi * torch.rand(width, generator=gen, dtype=DTYPE)

    def __call__(self, x: Tensor) -> Tensor:
        z = (x - self.mu) / self.sigma if self.mu is not None else x
        if self.p is None:
            return z
        if self.phase is not None:
            return math.sqrt(2.0 / self.p.shape[0]) * torch.cos(z @ self.p.T + self.phase)
        return self.activation(z @ self.p.T)


def sums(phi: Tensor, labels: Tensor, classes: int) -> tuple[Tensor, Tensor, Tensor]:
    """Gram ``(F', F')``, class sums ``(C, F')`` and class counts ``(C,)``."""
    one_hot = torch.nn.functional.one_hot(labels, classes).to(DTYPE)
    return phi.T @ phi, one_hot.T @ phi, one_hot.sum(0)


def search(grid: tuple[float, ...], score: Callable[[float], tuple[float, float]]) -> tuple[float, dict]:
    """The lambda of least ``score(lam)[0]`` (squared error) over ``grid``, then half a decade each side of
    it; and every tried lambda's ``(error, accuracy)``."""
    scores: dict[float, tuple[float, float]] = {}

    def best(lams: tuple[float, ...]) -> float:
        for lam in lams:
            if lam not in scores:
                scores[lam] = score(lam)
        return min(lams, key=lambda lam: scores[lam][0])

    lam = best(grid)
    return best((lam / 10**0.5, lam, lam * 10**0.5)), scores


def accuracy(head: Tensor, phi: Tensor, labels: Tensor) -> float:
    return _acc(phi @ head.T, labels)


def _acc(outputs: Tensor, labels: Tensor) -> float:
    return 100.0 * float((outputs.argmax(1) == labels).to(DTYPE).mean())


def arccos_from_dots(dots: Tensor, na: Tensor, nb: Tensor) -> Tensor:
    """The arc-cosine kernel (order 1) of vectors with inner products ``dots`` and norms ``na``, ``nb``:
    ``|a||b| (sin t + (pi - t) cos t) / 2pi``, ``t`` their angle. Overwrites ``dots``."""
    outer = na[:, None] * nb[None, :]
    cos = dots.div_(outer.clamp_min(torch.finfo(DTYPE).tiny)).clamp_(-1.0, 1.0)
    t = torch.arccos(cos)
    return outer.mul_(torch.sin(t) + (torch.pi - t) * cos).div_(2 * torch.pi)


def arccos_kernel(a: Tensor, b: Tensor) -> Tensor:
    """``E_p[max(0, p.a) max(0, p.b)]`` for ``p ~ N(0, I)``: ``(len(a), len(b))``."""
    return arccos_from_dots(a @ b.T, a.norm(dim=1), b.norm(dim=1))


def gaussian_kernel(a: Tensor, b: Tensor, gamma: float) -> Tensor:
    """``exp(-gamma |a - b|^2 / F)``, F the features' width: what rffNgG's products average to."""
    squared = (a.pow(2).sum(1)[:, None] + b.pow(2).sum(1)[None, :] - 2 * a @ b.T).clamp_min(0)
    return torch.exp(-gamma * squared / a.shape[1])


Z = TypeVar("Z")  # the samples a kernel takes

GAMMAS = (0.25, 0.5, 1.0, 2.0, 4.0)  # the Gaussian kernel's bandwidths tried when the recipe names none


def arccos_sum_kernel(a: Tensor, b: Tensor, parts: int) -> Tensor:
    """The sum of the arc-cosine kernels of ``parts`` equal slices of the features (one per layer)."""
    total = torch.zeros(len(a), len(b), dtype=DTYPE)
    for pa, pb in zip(a.chunk(parts, 1), b.chunk(parts, 1), strict=True):
        total += arccos_kernel(pa, pb)
    return total


def arccos_deep_kernel(a: Tensor, b: Tensor) -> Tensor:
    """The arc-cosine kernel of the arc-cosine kernel's feature space: ``k1(x, x) = |x|^2 / 2``."""
    return arccos_from_dots(arccos_kernel(a, b), a.norm(dim=1) / math.sqrt(2.0), b.norm(dim=1) / math.sqrt(2.0))


ROWS = 1024  # rows of a kernel matrix computed at once: its temporaries stay a few hundred MB at 18,000 columns


def row_chunked(kernel: Callable[[Tensor, Tensor], Tensor]) -> Callable[[Tensor, Tensor], Tensor]:
    """``kernel`` computed ``ROWS`` rows of ``a`` at a time into one ``(len(a), len(b))`` matrix (the kernels'
    elementwise temporaries would otherwise be several times the matrix itself)."""

    def rows(a: Tensor, b: Tensor) -> Tensor:
        out = torch.empty(len(a), len(b), dtype=DTYPE)
        for start in range(0, len(a), ROWS):
            out[start : start + ROWS] = kernel(a[start : start + ROWS], b)
        return out

    return rows


def kernel_of(recipe: Recipe, gamma: float | None) -> Callable[[Tensor, Tensor], Tensor]:
    if recipe.kernel == "rbf":
        assert gamma is not None
        return row_chunked(lambda a, b: gaussian_kernel(a, b, gamma))
    if recipe.kernel == "arccos-sum":
        parts = len(recipe.layers) * (2 if recipe.pool == "both" else 1)
        return row_chunked(lambda a, b: arccos_sum_kernel(a, b, parts))
    if recipe.kernel == "arccos-deep":
        return row_chunked(arccos_deep_kernel)
    return row_chunked(arccos_kernel)


def _dual(k: Tensor, targets: Tensor, lam: float) -> Tensor:
    """``(k + lam I)^-1 targets``; ``k`` is overwritten (its diagonal raised, then its Cholesky factor)."""
    k.diagonal().add_(lam)
    factor = torch.linalg.cholesky(k, out=k)
    return torch.cholesky_solve(targets, factor)


def _kernel_lambda(
    kernel: Callable[[Z, Z], Tensor], zf: Z, fit_y: Tensor, zs: Z, sel_y: Tensor, classes: int
) -> tuple[float, dict]:
    """The kernel lambda whose fit on ``zf`` errs least on ``zs``, and every tried one's (error, accuracy).
    One eigendecomposition ``K = V diag(e) V^T`` serves every lambda: the held-out predictions are
    ``K_sf V diag(1 / (e + lam)) V^T Y``. ``zf``, ``zs``: whatever ``kernel`` takes (features, or
    lexical_heads.py's joint rows)."""
    e, v = torch.linalg.eigh(kernel(zf, zf))
    left = kernel(zs, zf) @ v  # (n_sel, n_fit)
    right = v.T @ torch.nn.functional.one_hot(fit_y, classes).to(DTYPE)  # (n_fit, C)
    ys = torch.nn.functional.one_hot(sel_y, classes).to(DTYPE)

    def score(lam: float) -> tuple[float, float]:
        pred = left @ (right / (e.clamp_min(0) + lam)[:, None])
        return float((pred - ys).pow(2).sum()), 100.0 * float((pred.argmax(1) == sel_y).to(DTYPE).mean())

    return search(KERNEL_LAMBDAS, score)


def evaluate_kernel(recipe: Recipe, x: dict, y: dict, fit: tuple, sel: tuple, classes: int) -> dict:
    """The ridge of infinite width: ``K_t (K + lam I)^-1 Y`` on the standardised (or not) features; for
    the Gaussian kernel without a named bandwidth, the (bandwidth, lambda) of least held-out error."""
    t0 = time.perf_counter()
    (fit_x, fit_y), (sel_x, sel_y) = fit, sel
    fmap = FeatureMap(fit_x, recipe, 0)
    gammas: tuple[float | None, ...] = (recipe.gamma,) if recipe.kernel != "rbf" or recipe.gamma else GAMMAS
    tried = {g: _kernel_lambda(kernel_of(recipe, g), fmap(fit_x), fit_y, fmap(sel_x), sel_y, classes) for g in gammas}
    gamma = min(tried, key=lambda g: tried[g][1][tried[g][0]][0])
    lam, scores = tried[gamma]
    kernel = kernel_of(recipe, gamma)
    fmap = FeatureMap(x["train"], recipe, 0)
    z = fmap(x["train"])
    alpha = _dual(kernel(z, z), torch.nn.functional.one_hot(y["train"], classes).to(DTYPE), lam)
    test = (kernel(fmap(x["test"]), z) @ alpha).argmax(1)
    return {
        "recipe": str(recipe) + ("" if gamma is None or recipe.gamma else f" (g{gamma:g})"),
        "lambda": lam,
        "select_acc": scores[lam][1],
        "best_select_acc": max(acc for _, acc in scores.values()),
        "test": 100.0 * float((test == y["test"]).to(DTYPE).mean()),
        "seconds": time.perf_counter() - t0,
    }


def evaluate(recipe: Recipe, feats: dict, labels: dict, select: str, seed: int, fit_splits: str = "train") -> dict:
    t0 = time.perf_counter()
    classes = int(labels["train"].max()) + 1
    x = {s: features(feats[s], recipe) for s in SPLITS}
    y = {s: torch.from_numpy(labels[s]) for s in SPLITS}
    if fit_splits == "train+val":  # CLINC150's val split is training data too: fit on both
        x["train"], y["train"] = torch.cat([x["train"], x["val"]]), torch.cat([y["train"], y["val"]])
    if select == "holdout":  # the system's rule: global training index i % 5 == 0 held out
        held = torch.arange(len(y["train"])) % 5 == 0
        fit_x, fit_y, sel_x, sel_y = x["train"][~held], y["train"][~held], x["train"][held], y["train"][held]
    else:  # CLINC150's val split chooses
        if fit_splits != "train":
            raise ValueError("--select val needs --fit train (the val split cannot both fit and choose)")
        fit_x, fit_y, sel_x, sel_y = x["train"], y["train"], x["val"], y["val"]
    if math.isinf(recipe.rp):
        return {"select": select, "fit": fit_splits} | evaluate_kernel(
            recipe, x, y, (fit_x, fit_y), (sel_x, sel_y), classes
        )
    seeds = range(seed, seed + recipe.members)
    sel_target = torch.nn.functional.one_hot(sel_y, classes).to(DTYPE)

    member_errors: dict[float, float] = {}  # the members' own squared errors, summed

    def score_all(lams: tuple[float, ...]) -> dict[float, tuple[float, float]]:
        """Squared error and accuracy of the average on the selection samples at each lambda, one member's Gram
        at a time (memory of one F' x F' Gram whatever K); the members' summed errors into ``member_errors``."""
        outs = {lam: torch.zeros(len(sel_y), classes, dtype=DTYPE) for lam in lams}
        for s in seeds:
            fmap = FeatureMap(fit_x, recipe, s)
            gram, class_sum, _ = sums(fmap(fit_x), fit_y, classes)
            sel_phi = fmap(sel_x)
            sel_sums = sums(sel_phi, sel_y, classes)
            for lam in lams:
                head = ridge_head(gram, class_sum, lam)  # the system's solve
                outs[lam] += sel_phi @ head.T
                # the system's own error, from the selection samples' sums
                member_errors[lam] = member_errors.get(lam, 0.0) + squared_error(head, *sel_sums)
            del gram, class_sum, sel_phi
        for out in outs.values():
            out /= recipe.members
        return {lam: (float((outs[lam] - sel_target).pow(2).sum()), _acc(outs[lam], sel_y)) for lam in lams}

    def refine(errors: Callable[[float], float]) -> float:
        """The decade of least error, then half a decade each side of it (as search())."""
        lam = min(LAMBDAS, key=errors)
        halves = tuple(each for each in (lam / 10**0.5, lam * 10**0.5) if each not in scores)
        if halves:
            scores.update(score_all(halves))
        return min((lam / 10**0.5, lam, lam * 10**0.5), key=errors)

    scores = score_all(LAMBDAS)
    lam = refine(lambda each: scores[each][0])
    lam_members = refine(member_errors.__getitem__)
    # The final heads: every training sample (the held-out ones too), their own standardisation.
    test_out = {each: torch.zeros(len(y["test"]), classes, dtype=DTYPE) for each in {lam, lam_members}}
    for s in seeds:
        fmap = FeatureMap(x["train"], recipe, s)
        gram, class_sum, _ = sums(fmap(x["train"]), y["train"], classes)
        test_phi = fmap(x["test"])
        for each, out in test_out.items():
            out += test_phi @ ridge_head(gram, class_sum, each).T
        del gram, class_sum, test_phi
    return {
        "recipe": str(recipe),
        "select": select,
        "fit": fit_splits,
        "lambda": lam,
        "select_acc": scores[lam][1],
        "best_select_acc": max(acc for _, acc in scores.values()),
        "test": _acc(test_out[lam], y["test"]),
        "lambda_members": lam_members,
        "select_acc_members": scores[lam_members][1],
        "test_members": _acc(test_out[lam_members], y["test"]),
        "seconds": time.perf_counter() - t0,
    }


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The options every frozen-feature sweep shares: where CLINC150 and the feature cache are, the encoder's
    maximum length, torch's threads."""
    parser.add_argument(
        "--data-dir",
        default=os.environ.get("LORM_DATA_DIR", str(Path(__file__).resolve().parents[2] / "shared" / "datasets")),
    )
    parser.add_argument("--cache", default=str(Path(os.environ.get("TMPDIR", "/tmp")) / "lorm-feature-cache"))
    parser.add_argument("--max-length", type=int, default=64)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--encoder", default="minilm", help="minilm, mpnet (all-mpnet-base-v2) or a local transformers model directory"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--recipes", nargs="+", default=["6:mean:raw:rp5000", "456:mean:std:rp10000"])
    parser.add_argument("--select", choices=("holdout", "val"), default="holdout")
    parser.add_argument(
        "--fit", choices=("train", "train+val"), default="train", help="the splits the head is fitted on"
    )
    add_data_arguments(parser)
    parser.add_argument("--seed", type=int, default=0, help="the random projection's seed")
    parser.add_argument("--json", action="store_true", help="one JSON line per recipe")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    recipes = [Recipe.parse(r) for r in args.recipes]
    data = load_clinc(Path(args.data_dir))
    feats = cached_features(data, Path(args.cache), args.max_length, args.encoder)
    labels = {s: data[s][1] for s in SPLITS}
    if not args.json:
        head_line = f"{'recipe':28s} {'select':8s} {'fit':9s} {'lambda':>9s} {'sel acc':>7s} {'best':>6s}"
        print(f"{head_line} {'test':>6s} {'s':>5s}")
    for recipe in recipes:
        r = evaluate(recipe, feats, labels, args.select, args.seed, args.fit)
        if args.json:
            print(json.dumps(r), flush=True)
        else:
            print(
                f"{r['recipe']:28s} {r['select']:8s} {r['fit']:9s} {r['lambda']:9.3g} {r['select_acc']:7.2f} "
                f"{r['best_select_acc']:6.2f} {r['test']:6.2f} {r['seconds']:5.0f}",
                flush=True,
            )
            if "lambda_members" in r and r["lambda_members"] != r["lambda"]:
                print(
                    f"{'  members rule':28s} {'':8s} {'':9s} {r['lambda_members']:9.3g} "
                    f"{r['select_acc_members']:7.2f} {'':6s} {r['test_members']:6.2f}",
                    flush=True,
                )
    return 0


if __name__ == "__main__":
    sys.exit(main())
