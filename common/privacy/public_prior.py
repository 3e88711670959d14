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

In a run (the settings ``ncm.prior_*``, which ``ridge`` inherits) the prior is one file that ``lorm-prior`` writes
(:func:`write_prior`: the two tensors, float64, and the statement of what they were fitted on), named by
:func:`prior_digest`, the SHA-256 of the tensors' shapes and bytes. The coordinator reads it once and sends its
tensors in every features step and evaluation (:data:`PRIOR_MEAN`, :data:`PRIOR_BASIS`); a client applies only a
prior whose digest is the run's (:func:`received_prior`). Eigenvectors are fixed only up to sign (and, for equal
eigenvalues, rotation), and a float64 eigendecomposition differs in its low bits between machines: a prior is
fitted once and distributed, never refitted per party.
"""

from __future__ import annotations

import functools
import hashlib
import json
import random
import weakref
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

import torch
from safetensors import SafetensorError, safe_open
from safetensors.torch import save as safetensors_bytes
from torch import Tensor

from common.infra.files import atomic_write_bytes

CORPORA = ("chitchat",)
DTYPE = torch.float64
PRIOR_MEAN, PRIOR_BASIS = "prior/mean", "prior/basis"  # a plan's prior, by wire name
STATEMENT = "lorm.prior"  # the file's metadata key: the statement of what the prior was fitted on (JSON)
DIGEST = "lorm.prior_digest"


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


def prior_digest(mean: Tensor, basis: Tensor) -> str:
    """The SHA-256 (hex) of a prior's two tensors, shapes and float64 bytes: the name a run pins it by."""
    h = hashlib.sha256()
    for t in (mean, basis):
        t = t.detach().to("cpu", DTYPE).contiguous()
        h.update(json.dumps(list(t.shape)).encode())
        h.update(t.numpy().astype("<f8", copy=False).tobytes())
    return h.hexdigest()


def write_prior(path: Path, prior: PublicPrior, statement: dict[str, object]) -> str:
    """Write ``prior`` with ``statement`` (what it was fitted on: corpus, size, seed, the texts' digest, k, shrink,
    backbone and feature map) to ``path``, atomically; its digest."""
    digest = prior_digest(prior.mean, prior.basis)
    tensors = {"mean": prior.mean.to(DTYPE).contiguous(), "basis": prior.basis.to(DTYPE).contiguous()}
    metadata = {STATEMENT: json.dumps(statement | {"shrink": prior.shrink}, sort_keys=True), DIGEST: digest}
    atomic_write_bytes(path, safetensors_bytes(tensors, metadata=metadata))
    return digest


def read_prior(path: Path, digest: str = "") -> tuple[PublicPrior, dict[str, object]]:
    """The prior in ``path`` and its statement; ``ValueError`` unless it holds a float64 ``mean: (F,)`` and
    ``basis: (F, k)``, finite, whose digest is the one it states (and ``digest`` when given)."""
    try:
        with safe_open(str(path), framework="pt") as f:
            metadata = f.metadata() or {}
            tensors = {name: f.get_tensor(name) for name in f.keys()}
    except (OSError, SafetensorError) as err:
        raise ValueError(f"public prior {path}: cannot be read ({err})") from err
    mean, basis = tensors.get("mean"), tensors.get("basis")
    if mean is None or basis is None or set(tensors) != {"mean", "basis"}:
        raise ValueError(f"public prior {path}: want the tensors mean and basis, got {sorted(tensors)[:4]}")
    check_prior(mean, basis, f"public prior {path}")
    got = prior_digest(mean, basis)
    if got != metadata.get(DIGEST) or (digest and got != digest):
        wanted = digest or metadata.get(DIGEST)
        raise ValueError(f"public prior {path}: its tensors' digest is {got}, not {wanted}")
    try:
        statement = json.loads(metadata.get(STATEMENT, "{}"))
    except json.JSONDecodeError as err:
        raise ValueError(f"public prior {path}: its statement is not JSON ({err})") from err
    return PublicPrior(mean, basis, float(statement.get("shrink", 0.0))), statement


def check_prior(mean: Tensor, basis: Tensor, who: str, width: int | None = None, k: int | None = None) -> None:
    """``ValueError`` unless ``mean: (F,)`` and ``basis: (F, k)`` are float64 and finite (and ``F``, ``k`` those
    given)."""
    if mean.dtype != DTYPE or basis.dtype != DTYPE or mean.dim() != 1 or basis.dim() != 2:
        raise ValueError(
            f"{who}: want float64 mean (F,) and basis (F, k), got {mean.dtype} {tuple(mean.shape)} and "
            f"{basis.dtype} {tuple(basis.shape)}"
        )
    f, kept = basis.shape
    if mean.shape[0] != f or not 0 < kept <= f or (width is not None and f != width) or (k is not None and kept != k):
        raise ValueError(
            f"{who}: mean {tuple(mean.shape)} and basis {tuple(basis.shape)} do not fit"
            + (f" the run's F = {width} and k = {k}" if width is not None else "")
        )
    if not (torch.isfinite(mean).all() and torch.isfinite(basis).all()):
        raise ValueError(f"{who}: non-finite values")


def received_prior(tensors: dict[str, Tensor], width: int, k: int, digest: str) -> PublicPrior:
    """The prior a plan brings (``tensors``: its tensors by wire name), which a client applies only when it is the
    run's: ``(F,) = (width,)`` and ``(F, k)``, float64, finite, and of ``digest``; ``ValueError`` otherwise (a
    coordinator that sends another prior could make the head read whatever directions it chose).

    A plan is checked once, not once per batch that it scores: the answer is kept for as long as the plan's own two
    tensor objects live unchanged (the same objects, not modified in place since: torch counts in-place writes in
    ``Tensor._version``), and any other pair is hashed afresh."""
    mean, basis = tensors.get(PRIOR_MEAN), tensors.get(PRIOR_BASIS)
    if mean is None or basis is None:
        raise ValueError(f"the run's features pass a public prior (digest {digest[:16]}...): this plan holds none")
    key = (width, k, digest, mean._version, basis._version)
    kept = _RECEIVED.get(id(basis))
    if kept is not None and kept[0]() is basis and kept[1]() is mean and kept[2] == key:
        return PublicPrior(mean, basis, 0.0)
    check_prior(mean, basis, "the plan's public prior", width, k)
    got = prior_digest(mean, basis)
    if got != digest:
        raise ValueError(f"the plan's public prior has digest {got}, not the run's {digest}")
    _RECEIVED[id(basis)] = (weakref.ref(basis, functools.partial(_forget, id(basis))), weakref.ref(mean), key)
    return PublicPrior(mean, basis, 0.0)


# the pairs received_prior has passed, by their basis tensor's id: (the basis, its mean, what was checked), both held
# weakly; an entry goes when its basis does (tensors compare element by element, so they cannot be a WeakKeyDictionary's
# keys)
_RECEIVED: dict[int, tuple[weakref.ref[Tensor], weakref.ref[Tensor], tuple[object, ...]]] = {}


def _forget(ident: int, gone: weakref.ref[Tensor]) -> None:
    """Drop the entry of a basis that is gone (unless its id already names another tensor's entry)."""
    entry = _RECEIVED.get(ident)
    if entry is not None and entry[0] is gone:
        del _RECEIVED[ident]
