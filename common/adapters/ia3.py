"""(IA)^3 layers (Liu et al. 2022) on the LoRA target modules.

``IA3Linear`` rescales a frozen linear layer with a trained vector, in the paper's residual form
(its appendix, "Combination of (IA)^3 and RegMean": the vector starts at 0, not 1):

- side ``"B"``, on the layer's output: ``y = (1 + m) o (W0 x) + b0``, i.e. ``dW = diag(m) W0``;
- side ``"A"``, on the layer's input: ``y = W0 ((1 + m) o x) + b0``, i.e. ``dW = W0 diag(m)``;

with ``m = s * l + l_e``: ``l`` the trained vector (``(d_out,)`` or ``(d_in,)``), ``s`` its scale
(as LoRA's), and ``l_e`` a frozen vector of the same side (the earlier tasks' merged vectors, in a
Gram view or at evaluation). One matrix product per call, like the frozen layer alone. Sides are
named as LoRA's factors: ``B`` acts on the output, ``A`` on the input.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from common.adapters.lora import LoRALinear, replace_lora_layers

SIDE = {"output": "B", "input": "A"}  # setting ia3.side -> the trained side's name


class IA3Linear(LoRALinear):
    """``nn.Linear`` rescaled on its output (``side="B"``) or input (``side="A"``) by ``1 + s l + l_e``.

    The inherited LoRA factors are unused (rank 1, scale of their product 0) so that the layer
    keeps :class:`~common.adapters.lora.LoRALinear`'s interface (Gram hooks, frozen low-rank extra).
    """

    lora_le: Tensor  # the frozen extra vector l_e (a buffer)

    def __init__(self, base: nn.Linear, side: str, scale: float = 1.0) -> None:
        if side not in SIDE.values():
            raise ValueError(f"an (IA)^3 side is 'B' (output) or 'A' (input), got {side!r}")
        super().__init__(base, rank=1, scale=scale)
        d_out, d_in = base.weight.shape
        self.side = side
        size = d_out if side == "B" else d_in
        self.lora_l = nn.Parameter(torch.zeros(size, dtype=base.weight.dtype, device=base.weight.device))
        self.register_buffer("lora_le", torch.zeros_like(self.lora_l.detach()))
        self.set_trainable(())

    def set_trainable(self, factors: Iterable[str]) -> None:
        """Make the vector trainable when ``factors`` names this layer's side (nothing else ever trains)."""
        names = set(factors)
        side = getattr(self, "side", "B")  # not yet set during LoRALinear.__init__
        if not names <= {side}:
            raise ValueError(f"this (IA)^3 layer trains side {side!r} only, got {sorted(names)}")
        self.lora_A.requires_grad_(False)
        self.lora_B.requires_grad_(False)
        if hasattr(self, "lora_l"):
            self.lora_l.requires_grad_(side in names)

    def load_factors(self, b: Tensor, a: Tensor) -> None:
        raise TypeError("an (IA)^3 layer has no LoRA factors: load its vector (load_vector)")

    @torch.no_grad()
    def load_vector(self, vector: Tensor, extra: Tensor | None = None) -> None:
        """Set the trained vector and the frozen ``l_e`` (``None``: zero), each shaped like the side."""
        for what, t in (("vector", vector), ("extra vector", extra)):
            if t is not None and tuple(t.shape) != tuple(self.lora_l.shape):
                raise ValueError(f"(IA)^3 {what} must be {tuple(self.lora_l.shape)}, got {tuple(t.shape)}")
        self.lora_l.copy_(vector)
        self.set_extra_vector(extra)

    @torch.no_grad()
    def set_extra_vector(self, extra: Tensor | None) -> None:
        if extra is not None and tuple(extra.shape) != tuple(self.lora_l.shape):
            raise ValueError(f"(IA)^3 extra vector must be {tuple(self.lora_l.shape)}, got {tuple(extra.shape)}")
        self.lora_le = torch.zeros_like(self.lora_le) if extra is None else extra.to(self.lora_le)

    def _m(self) -> Tensor:
        return self.scale * self.lora_l + self.lora_le if self.scale != 0.0 else self.lora_le

    def delta(self) -> Tensor:
        m, w0 = self._m(), self.base.weight
        own = m[:, None] * w0 if self.side == "B" else w0 * m[None, :]
        return own + self.extra_B @ self.extra_A

    def forward(self, x: Tensor) -> Tensor:
        # x: (..., d_in) -> (..., d_out)
        factor = 1.0 + self._m()
        if self.side == "B":
            y = F.linear(x, self.base.weight) * factor
            y = y + self.base.bias if self.base.bias is not None else y
        else:
            y = F.linear(x * factor, self.base.weight, self.base.bias)
        if self.extra_A.shape[0] > 0:
            y = y + F.linear(F.linear(x, self.extra_A), self.extra_B)
        return y


def apply_ia3(model: nn.Module, side: str) -> list[str]:
    """Replace every :class:`LoRALinear` of ``model`` by an :class:`IA3Linear` of ``side`` on the same frozen
    linear layer (same name, same scale); returns the layers' names in module order."""
    return replace_lora_layers(model, lambda _name, old: IA3Linear(old.base, side, old.scale))
