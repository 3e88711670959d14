"""Public priors of the private heads: statistics of public text, encoded by the run's own backbone and feature map,
that shape each record's features before they are clipped and noised.

A prior is a centre ``m`` and a whitening basis ``W: (F, k)``, both from public features only: ``m`` their mean,
``W``'s columns the top ``k`` eigenvectors ``u_i`` of their covariance scaled by ``1 / sqrt(l_i + s l̄)`` (``s`` the
shrinkage toward the mean eigenvalue ``l̄`` of the ``k`` kept). A record's features ``x`` become ``(x - m) W``, then
are clipped to ``C`` as before. The transform reads no private record, so the mechanism's sensitivity and its
guarantee are unchanged; what changes is how much of the clipped norm ``C`` carries the classes' signal. The common
direction of every sentence embedding (its mean) and the low-variance directions, which hold little but noise, leave
the features; the noise of a class sum then falls on ``k`` coordinates instead of ``F``.

The assumption the guarantee then rests on: the public corpus is disjoint from every client's records and was chosen
before any private record was seen (its name, size and digest are part of every statement that uses it).

Corpora come from packages, never from a download at run time: ``chitchat`` is ``chitchat-dataset`` (MIT; the BYU
Chit-Chat Challenge, 258,145 English utterances, 223,039 distinct, of open-domain conversation, no labels).
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
from dataclasses import dataclass
from importlib import resources

import torch
from torch import Tensor

CORPORA = ("chitchat",)
DTYPE = torch.float64


@dataclass(frozen=True)
class Corpus:
    """``size`` public texts of corpus ``name``, drawn by ``seed``; ``digest`` the SHA-256 of the texts in order
    (one per line), which names exactly what a run encoded."""

    name: str
    seed: int
    texts: tuple[str, ...]
    digest: str

    def statement(self) -> dict[str, object]:
        return {"corpus": self.name, "size": len(self.texts), "seed": self.seed, "digest": self.digest}


def load_corpus(name: str, size: int, seed: int = 0) -> Corpus:
    """The first ``size`` of corpus ``name``'s distinct non-empty utterances, shuffled by ``seed``. ``ValueError``
    for an unknown corpus or a ``size`` it does not hold; ``ModuleNotFoundError`` (with the package to install)
    when its package is missing."""
    if name not in CORPORA:
        raise ValueError(f"public corpus {name!r}: want one of {list(CORPORA)}")
    texts = list(_chitchat())
    if not 0 < size <= len(texts):
        raise ValueError(f"public corpus {name!r} holds {len(texts)} distinct utterances, not {size}")
    random.Random(seed).shuffle(texts)
    chosen = tuple(texts[:size])
    digest = hashlib.sha256("\n".join(chosen).encode()).hexdigest()
    return Corpus(name, seed, chosen, digest)


@functools.cache
def _chitchat() -> tuple[str, ...]:
    """chitchat-dataset's utterances: each message's text, stripped, distinct and sorted (a canonical order); read
    once per process."""
    try:
        path = resources.files("chitchat_dataset") / "dataset.json"
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError("public corpus 'chitchat': install the package chitchat-dataset") from err
    conversations = json.loads(path.read_text(encoding="utf-8"))
    texts = {
        u["text"].strip()
        for conversation in conversations.values()
        for message in conversation["messages"]
        for u in message
    }
    return tuple(sorted(t for t in texts if t))


@dataclass(frozen=True)
class PublicPrior:
    """A centre ``mean: (F,)`` and a basis ``basis: (F, k)`` fitted on public features (:func:`fit_prior`)."""

    mean: Tensor
    basis: Tensor
    shrink: float

    @property
    def width(self) -> int:
        return int(self.basis.shape[1])

    def apply(self, x: Tensor) -> Tensor:
        """``(n, F)`` features -> ``(n, k)``: ``(x - mean) basis``, float64."""
        return (x.to(DTYPE) - self.mean) @ self.basis


def fit_prior(public: Tensor, k: int, shrink: float) -> PublicPrior:
    """The prior of the public features ``public: (n, F)``: their mean and the top ``k`` eigenvectors of their
    covariance, each scaled by ``1 / sqrt(l_i + shrink * mean(l_1..l_k))``. ``ValueError`` unless ``0 < k <= F``,
    ``shrink >= 0``, and at least two public rows."""
    n, width = public.shape
    if not 0 < k <= width:
        raise ValueError(f"public prior: k = {k} must be in 1..{width}, the features' width")
    if shrink < 0 or n < 2:
        raise ValueError(f"public prior: want shrink >= 0 and two or more public rows, got {shrink} and {n}")
    x = public.to(DTYPE)
    mean = x.mean(0)
    values, vectors = torch.linalg.eigh(torch.cov(x.T))
    values, vectors = values.flip(0)[:k].clamp_min(0.0), vectors.flip(1)[:, :k]
    scale = (values + shrink * values.mean()).clamp_min(torch.finfo(DTYPE).tiny).rsqrt()
    return PublicPrior(mean, vectors * scale, shrink)
