"""The prompt pools of L2P and CODA-Prompt: their tensors, shapes and initialisation.

Both methods train a pool of prompts on the frozen backbone ``W0`` (``Mode.PROMPT``). The
coordinator holds the pool and initialises it (it never builds a model: the pool's width is
the head's input, ``ModelSpec.feature_dim``, which every backbone here shares with its token
embeddings); a plan hands out the pool (``RoundPlan.prompt``), and a client sends back the
change of the components it trained (``delta/<name>``). Every pool tensor has the components
along its first dimension; the first ``RoundPlan.prompt_frozen`` of them are frozen.

- L2P (Wang et al. 2022): ``l2p.prompts (pool, length, F)`` and ``l2p.keys (pool, F)``, both
  ``U(-1, 1)`` at the start (as the paper's code initialises them); all trained every round.
- CODA-Prompt (Smith et al. 2023): ``coda.prompts (m, length, F)``, ``coda.keys (m, F)`` and
  ``coda.attention (m, F)`` where ``m`` grows by ``components // tasks`` per task. A task's new
  components are drawn ``N(0, 1)`` and orthonormalised against the earlier ones
  (:func:`orthonormal_rows`, CODA-P's Gram-Schmidt initialisation); the earlier ones are frozen.
"""

from __future__ import annotations

import torch
from torch import Tensor

L2P_PROMPTS, L2P_KEYS = "l2p.prompts", "l2p.keys"
CODA_PROMPTS, CODA_KEYS, CODA_ATTENTION = "coda.prompts", "coda.keys", "coda.attention"


def trained_shapes(prompt: dict[str, tuple[int, ...]], frozen: int) -> dict[str, tuple[int, ...]]:
    """The shapes of what a client trains and sends of a pool with these shapes: all but the first
    ``frozen`` components of each tensor."""
    return {name: (shape[0] - frozen, *shape[1:]) for name, shape in prompt.items()}


def init_l2p(pool: int, length: int, width: int, seed: int, bound: float = 1.0) -> dict[str, Tensor]:
    """L2P's pool at the start: prompts ``(pool, length, width)`` and keys ``(pool, width)``,
    ``U(-bound, bound)`` (L2P's: 1), float64."""
    gen = torch.Generator().manual_seed(seed * 1_000_003 + 29)
    return {
        L2P_PROMPTS: torch.empty(pool, length, width, dtype=torch.float64).uniform_(-bound, bound, generator=gen),
        L2P_KEYS: torch.empty(pool, width, dtype=torch.float64).uniform_(-bound, bound, generator=gen),
    }


def orthonormal_rows(old: Tensor, count: int, generator: torch.Generator) -> Tensor:
    """``count`` new unit rows, each orthogonal to every row of ``old (s, n)`` and to each other.

    Each starts as an ``N(0, 1)`` draw and loses its projection on the span of the rows before
    it (modified Gram-Schmidt, twice for round-off, in float64). ``old`` need not be orthogonal
    (trained components are not). Where the rows before it already span the space (``s +
    count > n``), no orthogonal direction is left: the draw is kept, normalised.
    """
    n = old.shape[1]
    basis = []
    if old.shape[0]:
        q, r = torch.linalg.qr(old.to(torch.float64).T)  # (n, s): columns span the old rows
        keep = r.diagonal().abs() > 1e-10 * max(float(r.diagonal().abs().max()), 1e-300)
        basis = list(q[:, keep].T)
    out = torch.empty(count, n, dtype=torch.float64)
    for i in range(count):
        v = torch.randn(n, dtype=torch.float64, generator=generator)
        u = v.clone()
        for _ in range(2):
            for b in basis:
                u -= (u @ b) * b
        norm = float(u.norm())
        if norm < 1e-8 * float(v.norm()):  # the space is full
            u, norm = v, float(v.norm())
        else:
            basis.append(u / norm)
        out[i] = u / norm
    return out


def grow_coda(
    pool: dict[str, Tensor], per_task: int, length: int, width: int, seed: int, task: int
) -> dict[str, Tensor]:
    """CODA-P's pool at the start of ``task``: ``pool`` (empty before the first task) with
    ``per_task`` new components, orthonormal to the earlier ones per tensor (prompts flattened)."""
    gen = torch.Generator().manual_seed((seed * 1_000_003 + 31) * 1_000_003 + task)
    shapes = {CODA_PROMPTS: (length, width), CODA_KEYS: (width,), CODA_ATTENTION: (width,)}
    out = {}
    for name, tail in shapes.items():
        old = pool.get(name, torch.zeros(0, *tail, dtype=torch.float64)).to(torch.float64)
        new = orthonormal_rows(old.flatten(1), per_task, gen).reshape(per_task, *tail)
        out[name] = torch.cat([old, new])
    return out
