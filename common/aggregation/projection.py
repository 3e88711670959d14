"""The closed-form heads' random projection ``P: (F', F)``: seeded, so that every client, every evaluation and
every server of an export draws the same matrix from the run's seed alone.

An export does not hold ``P`` (the best head's is 40,000 x 4,608 numbers, 1.5 GB in float64): it names the seed
and the shape, and a fingerprint of the matrix its run drew (:func:`fingerprint`). A server draws ``P`` again and
refuses to score when its draw differs (another torch whose generator draws other numbers): the head would be
applied to other features than it was solved on, and every answer would be wrong without an error.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import torch
from torch import Tensor

GENERATOR = "torch.Generator(cpu).manual_seed(seed * 1000003 + 101), torch.randn float64"  # what the card records


@lru_cache(maxsize=4)
def draw(seed: int, dim: int, d_in: int) -> Tensor:
    """``P: (dim, d_in)``, ``N(0, 1)`` entries, float64, drawn by :data:`GENERATOR` (cached: the best head's
    is drawn once per process)."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 101)
    return torch.randn(dim, d_in, generator=gen, dtype=torch.float64)


def fingerprint(matrix: Tensor) -> str:
    """The SHA-256 of ``matrix``'s float64 bytes, row-major: equal for two draws exactly when every entry is."""
    values = matrix.detach().to(device="cpu", dtype=torch.float64).contiguous()
    return hashlib.sha256(values.numpy().tobytes()).hexdigest()


def described(seed: int, dim: int, d_in: int) -> dict[str, object]:
    """What an export records of the projection: the generator, seed, shape and fingerprint of its draw."""
    return {"generator": GENERATOR, "seed": seed, "shape": [dim, d_in], "sha256": _digest(seed, dim, d_in)}


@lru_cache(maxsize=16)
def _digest(seed: int, dim: int, d_in: int) -> str:
    # drawn apart from draw()'s cache: a coordinator that exports does not keep the matrix (1.5 GB for the best
    # head) for the rest of the run, only its digest
    return fingerprint(draw.__wrapped__(seed, dim, d_in))


def check(recorded: dict[str, object]) -> Tensor:
    """The projection an export records, drawn again; ``ValueError`` saying why when this process cannot draw the
    same matrix (another generator, or another torch's numbers)."""
    try:
        seed, shape, digest = int(recorded["seed"]), recorded["shape"], str(recorded["sha256"])  # type: ignore[call-overload]
        dim, d_in = (int(n) for n in shape)  # type: ignore[attr-defined]
    except (KeyError, TypeError, ValueError) as err:
        raise ValueError(f"the card's projection {recorded!r:.200} is not a seed, a shape and a sha256") from err
    if recorded.get("generator") != GENERATOR:
        raise ValueError(
            f"the card's projection was drawn by {recorded.get('generator')!r:.200}, this version draws by "
            f"{GENERATOR!r}: serve it with the project version that exported it"
        )
    matrix = draw(seed, dim, d_in)
    if fingerprint(matrix) != digest:
        raise ValueError(
            f"the random projection drawn here (seed {seed}, {dim} x {d_in}, torch {torch.__version__}) is not the "
            "one the run drew (its sha256 differs): this torch's generator draws other numbers, and the head would "
            "score other features than it was solved on; serve it with the torch version that trained it"
        )
    return matrix
