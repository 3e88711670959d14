"""VeRA layers (Kopiczko et al. 2024) on the LoRA target modules, and their frozen random matrices.

``VeRALinear`` computes ``y = W0 x + b0 + s * lb o (B (ld o (A x))) + B_e A_e x``:

- ``B: (d_out, r)`` and ``A: (r, d_in)`` are frozen and random, drawn from a seed and the layer's
  name (:func:`frozen_matrices`), so that every client and the coordinator rebuild the same ones
  and they never travel;
- ``lb: (d_out,)`` (zero at a task's start) and ``ld: (r,)`` (``vera.d_init``) are the trained
  vectors. Rounds train one of them, as LoRM trains ``B`` or ``A``: the ``"B"`` side is ``lb``
  (it scales ``B``'s output), the ``"A"`` side is ``ld``;
- ``B_e A_e`` is the frozen low-rank delta of :class:`~common.adapters.lora.LoRALinear` (earlier tasks).

Its delta is the low-rank product ``(diag(lb) B diag(ld)) A`` (:func:`product`): everything that
works on LoRA factors (Gram views, the task-level RegMean, export) works on it unchanged. The
original shares one ``A, B`` pair across layers, sliced to each shape; here each layer draws its
own from the same seed, which changes nothing the merges rely on.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.adapters.lora import LoRALinear, init_lora_a, replace_lora_layers

SIDES = ("B", "A")  # the trained vector of each side: "B" -> lb (d_out,), "A" -> ld (r,)


def frozen_matrices(seed: int, name: str, d_out: int, d_in: int, rank: int) -> tuple[Tensor, Tensor]:
    """The layer's frozen ``B: (d_out, r)`` and ``A: (r, d_in)``, float32, from ``seed`` and ``name`` alone.

    Both are drawn like ``nn.Linear`` weights of their input width (kaiming-uniform, a=sqrt(5)), as
    the original initialises its shared matrices.
    """
    gen = torch.Generator().manual_seed(seed * 1_000_003 + zlib.crc32(name.encode()))
    a = init_lora_a(rank, d_in, gen)
    b = init_lora_a(d_out, rank, gen)
    return b, a


def product(lb: Tensor, ld: Tensor, b: Tensor, a: Tensor) -> tuple[Tensor, Tensor]:
    """The delta ``diag(lb) B diag(ld) A`` as low-rank factors ``(d_out, r)``, ``(r, d_in)``."""
    return lb[:, None] * b * ld[None, :], a


class VeRALinear(LoRALinear):
    """``nn.Linear`` plus VeRA's scaled frozen random low-rank update and an optional frozen delta.

    ``lora_B`` and ``lora_A`` hold VeRA's frozen ``B`` and ``A`` (never trained); ``lora_lb`` and
    ``lora_ld`` are the trained vectors.
    """

    def __init__(self, base: nn.Linear, rank: int, seed: int, name: str, scale: float = 1.0) -> None:
        super().__init__(base, rank, scale)
        d_out, d_in = base.weight.shape
        b, a = frozen_matrices(seed, name, d_out, d_in, rank)
        with torch.no_grad():
            self.lora_B.copy_(b)
            self.lora_A.copy_(a)
        self.lora_lb = nn.Parameter(torch.zeros_like(self.lora_B[:, 0]))
        self.lora_ld = nn.Parameter(torch.zeros_like(self.lora_A[:, 0]))
        self.set_trainable(())

    def set_trainable(self, factors: Iterable[str]) -> None:
        """Make exactly the named sides' vectors trainable (``"B"``: ``lb``, ``"A"``: ``ld``)."""
        names = set(factors)
        if not names <= set(SIDES):
            raise ValueError(f"sides must be a subset of {{'B', 'A'}}, got {sorted(names)}")
        self.lora_A.requires_grad_(False)
        self.lora_B.requires_grad_(False)
        if hasattr(self, "lora_lb"):  # not yet during LoRALinear.__init__
            self.lora_lb.requires_grad_("B" in names)
            self.lora_ld.requires_grad_("A" in names)

    def vector(self, side: str) -> nn.Parameter:
        """The trained vector of ``side``: ``lb`` for ``"B"``, ``ld`` for ``"A"``."""
        if side not in SIDES:
            raise ValueError(f"a VeRA side is 'B' or 'A', got {side!r}")
        return self.lora_lb if side == "B" else self.lora_ld

    def load_factors(self, b: Tensor, a: Tensor) -> None:
        raise TypeError("a VeRA layer's B and A are frozen and seeded: load its vectors (load_vectors)")

    @torch.no_grad()
    def load_vectors(self, lb: Tensor, ld: Tensor) -> None:
        """Set ``lb: (d_out,)`` and ``ld: (r,)`` (cast to the layer's dtype)."""
        if tuple(lb.shape) != tuple(self.lora_lb.shape) or tuple(ld.shape) != tuple(self.lora_ld.shape):
            raise ValueError(
                f"VeRA vectors must be lb {tuple(self.lora_lb.shape)} and ld {tuple(self.lora_ld.shape)}, "
                f"got lb {tuple(lb.shape)} and ld {tuple(ld.shape)}"
            )
        self.lora_lb.copy_(lb)
        self.lora_ld.copy_(ld)

    def delta(self) -> Tensor:
        b, a = product(self.lora_lb, self.lora_ld, self.lora_B, self.lora_A)
        return self.scale * b @ a + self.extra_B @ self.extra_A

    def forward(self, x: Tensor) -> Tensor:
        # x: (..., d_in) -> (..., d_out)
        y = self.base(x)
        if self.scale != 0.0:
            y = y + self.scale * self.lora_lb * F.linear(F.linear(x, self.lora_A) * self.lora_ld, self.lora_B)
        if self.extra_A.shape[0] > 0:
            y = y + F.linear(F.linear(x, self.extra_A), self.extra_B)
        return y


def apply_vera(model: nn.Module, rank: int, seed: int) -> list[str]:
    """Replace every :class:`LoRALinear` of ``model`` by a :class:`VeRALinear` of ``rank`` on the same
    frozen linear layer (same name, same scale); returns the layers' names in module order."""
    return replace_lora_layers(model, lambda name, old: VeRALinear(old.base, rank, seed, name, old.scale))
