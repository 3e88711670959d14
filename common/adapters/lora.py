"""LoRA layers, Gram capture, and placement of LoRA in a backbone (docs/METHOD.md §1, §3).

``LoRALinear`` computes ``y = W0 x + b0 + s * B A x + B_e A_e x``:

- ``W0: (d_out, d_in)``, ``b0`` — the wrapped, frozen ``nn.Linear``;
- ``B: (d_out, r)`` zero-initialised and ``A: (r, d_in)`` kaiming-uniform — the current factors,
  ``s`` their scale (1: the reference uses plain ``B @ A``);
- ``B_e: (d_out, k)``, ``A_e: (k, d_in)`` — an optional frozen low-rank delta (previous tasks'
  factors, or the merged model of all tasks), empty (``k = 0``) by default.

A sum of low-rank products is itself one low-rank product of concatenated factors, so any
number of frozen deltas is held as a single pair.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import Tensor, nn

# Regular expressions over dotted module names (``model.named_modules()``), per backbone family.
TARGET_RULES: dict[str, tuple[str, ...]] = {
    # timm ViT: every block's attention and MLP projections; not the patch embedding or head.
    "vit": (
        r"(^|\.)blocks\.\d+\.attn\.qkv$",
        r"(^|\.)blocks\.\d+\.attn\.proj$",
        r"(^|\.)blocks\.\d+\.mlp\.fc1$",
        r"(^|\.)blocks\.\d+\.mlp\.fc2$",
    ),
    # T5: every linear layer of encoder and decoder (q, k, v, o, wi, wo, cross-attention too).
    "t5": (r"(^|\.)(encoder|decoder)\.block\.\d+\..*\.(q|k|v|o|wi|wi_0|wi_1|wo)$",),
    # BERT-like encoders: query, key, value, attention output, intermediate, output dense
    # (MPNet names its attention's four projections attn.q, .k, .v, .o).
    "bert": (
        r"(^|\.)layer\.\d+\.attention\.self\.(query|key|value)$",
        r"(^|\.)layer\.\d+\.attention\.attn\.(q|k|v|o)$",
        r"(^|\.)layer\.\d+\.attention\.output\.dense$",
        r"(^|\.)layer\.\d+\.intermediate\.dense$",
        r"(^|\.)layer\.\d+\.output\.dense$",
    ),
}


def init_lora_a(rank: int, d_in: int, generator: torch.Generator | None = None) -> Tensor:
    """A fresh ``A: (rank, d_in)`` drawn like ``nn.Linear`` weights (kaiming-uniform, a=sqrt(5)).

    That initialisation is ``U(-1/sqrt(d_in), 1/sqrt(d_in))``.
    """
    bound = 1.0 / math.sqrt(d_in)
    return torch.empty(rank, d_in).uniform_(-bound, bound, generator=generator)


class LoRALinear(nn.Module):
    """``nn.Linear`` plus a trainable low-rank update and an optional frozen low-rank delta."""

    def __init__(self, base: nn.Linear, rank: int, scale: float = 1.0) -> None:
        super().__init__()
        if not isinstance(base, nn.Linear):
            raise TypeError(f"LoRALinear wraps nn.Linear, got {type(base).__name__}")
        if rank < 1:
            raise ValueError(f"`rank` should be a positive integer, got {rank}")
        self.base = base
        for p in self.base.parameters():
            p.requires_grad_(False)
        d_out, d_in = base.weight.shape
        dtype, device = base.weight.dtype, base.weight.device
        self.rank = rank
        self.scale = scale
        self.lora_A = nn.Parameter(init_lora_a(rank, d_in).to(device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(d_out, rank, device=device, dtype=dtype))
        self.register_buffer("extra_A", torch.zeros(0, d_in, device=device, dtype=dtype))
        self.register_buffer("extra_B", torch.zeros(d_out, 0, device=device, dtype=dtype))
        self.set_trainable(())

    @property
    def weight(self) -> Tensor:
        """``W0``: some models read their linear layers' weight directly (T5 checks its dtype)."""
        return self.base.weight

    @property
    def bias(self) -> Tensor | None:
        return self.base.bias

    @property
    def in_features(self) -> int:
        return self.base.in_features

    @property
    def out_features(self) -> int:
        return self.base.out_features

    def set_trainable(self, factors: Iterable[str]) -> None:
        """Make exactly the named factors (a subset of ``{"A", "B"}``) trainable."""
        names = set(factors)
        if not names <= {"A", "B"}:
            raise ValueError(f"factors must be a subset of {{'A', 'B'}}, got {sorted(names)}")
        self.lora_A.requires_grad_("A" in names)
        self.lora_B.requires_grad_("B" in names)

    @torch.no_grad()
    def load_factors(self, b: Tensor, a: Tensor) -> None:
        """Set the current factors ``B: (d_out, r)``, ``A: (r, d_in)`` (cast to the layer's dtype)."""
        if tuple(b.shape) != tuple(self.lora_B.shape) or tuple(a.shape) != tuple(self.lora_A.shape):
            raise ValueError(
                f"factors must be B {tuple(self.lora_B.shape)} and A {tuple(self.lora_A.shape)}, "
                f"got B {tuple(b.shape)} and A {tuple(a.shape)}"
            )
        self.lora_B.copy_(b)
        self.lora_A.copy_(a)

    @torch.no_grad()
    def set_extra(self, b: Tensor | None, a: Tensor | None) -> None:
        """Set the frozen delta ``B_e A_e`` (``None`` clears it)."""
        d_out, d_in = self.base.weight.shape
        like = self.base.weight
        if b is None or a is None:
            b, a = like.new_zeros(d_out, 0), like.new_zeros(0, d_in)
        if b.dim() != 2 or a.dim() != 2 or b.shape[0] != d_out or a.shape[1] != d_in or b.shape[1] != a.shape[0]:
            raise ValueError(
                f"extra factors must be B ({d_out}, k) and A (k, {d_in}), got B {tuple(b.shape)} and A {tuple(a.shape)}"
            )
        self.extra_B = b.to(like)
        self.extra_A = a.to(like)

    def delta(self) -> Tensor:
        """The dense update ``s B A + B_e A_e``: ``(d_out, d_in)`` (for tests and export)."""
        return self.scale * self.lora_B @ self.lora_A + self.extra_B @ self.extra_A

    def forward(self, x: Tensor) -> Tensor:
        # x: (..., d_in) -> (..., d_out)
        y = self.base(x)
        if self.scale != 0.0:
            y = y + self.scale * F.linear(F.linear(x, self.lora_A), self.lora_B)
        if self.extra_A.shape[0] > 0:
            y = y + F.linear(F.linear(x, self.extra_A), self.extra_B)
        return y


def apply_lora(model: nn.Module, targets: str | Sequence[str], rank: int, scale: float = 1.0) -> list[str]:
    """Wrap every ``nn.Linear`` whose dotted name matches ``targets`` in a :class:`LoRALinear`.

    ``targets`` is a key of :data:`TARGET_RULES` (``"vit"``, ``"t5"``, ``"bert"``) or a list of
    regular expressions. Every other parameter of ``model`` is frozen. Returns the wrapped
    layers' names in module order; raises if none matched.
    """
    patterns = TARGET_RULES[targets] if isinstance(targets, str) else tuple(targets)
    if isinstance(targets, str) and targets not in TARGET_RULES:
        raise ValueError(f"unknown target rule {targets!r}; known: {sorted(TARGET_RULES)}")
    compiled = [re.compile(p) for p in patterns]
    for p in model.parameters():
        p.requires_grad_(False)
    names = [
        name
        for name, mod in model.named_modules()
        if isinstance(mod, nn.Linear) and any(c.search(name) for c in compiled)
    ]
    if not names:
        raise ValueError(f"no nn.Linear layer matched the LoRA targets {list(patterns)}")
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, LoRALinear(getattr(parent, child), rank, scale))
    return names


def replace_lora_layers(model: nn.Module, make: Callable[[str, LoRALinear], LoRALinear]) -> list[str]:
    """Replace every :class:`LoRALinear` of ``model`` by ``make(name, layer)`` (another adapter on the same
    frozen linear layer: VeRA, (IA)^3); returns the layers' names in module order."""
    names = list(lora_layers(model))
    for name in names:
        parent_name, _, child = name.rpartition(".")
        parent = model.get_submodule(parent_name) if parent_name else model
        setattr(parent, child, make(name, getattr(parent, child)))
    return names


def lora_layers(model: nn.Module) -> dict[str, LoRALinear]:
    """The model's LoRA layers by dotted name (the name of the wrapped linear layer)."""
    return {name: mod for name, mod in model.named_modules() if isinstance(mod, LoRALinear)}


class GramRecorder:
    """Accumulates ``G = sum_x x x^T`` (or only its diagonal) of each module's input, in float64.

    Every row of the input counts: a ``(batch, tokens, d_in)`` input contributes
    ``batch * tokens`` rows, except rows that ``row_mask`` (``(batch, tokens)``, set per batch)
    marks 0, such as padding tokens; the mask applies to inputs whose leading dimensions
    match it. Hooks are attached only inside :meth:`recording`.

    With ``energy_clip`` ``c`` (differential privacy, ``common/privacy/training.py``), each sample's kept rows of
    each module's input, ``(batch, tokens, d_in)`` or ``(batch, d_in)``, are scaled down together so that their
    energy ``sum_t |x_t|^2 <= c``: one sample then moves each module's Gram by at most ``c`` (Frobenius).
    """

    def __init__(
        self, modules: dict[str, nn.Module], full: bool | dict[str, bool] = False, energy_clip: float | None = None
    ) -> None:
        self.modules = modules
        self.full = full if isinstance(full, dict) else {name: full for name in modules}
        self.grams: dict[str, Tensor] = {}
        self.rows: dict[str, int] = {name: 0 for name in modules}
        self.row_mask: Tensor | None = None
        self.energy_clip = energy_clip

    def _clipped(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """``x`` (float64), each sample's (leading index's) kept rows scaled to energy at most :attr:`energy_clip`."""
        assert self.energy_clip is not None
        x = x.to(torch.float64)
        rows = x.reshape(x.shape[0], -1, x.shape[-1]).square().sum(-1)  # (batch, tokens)
        if mask is not None:
            rows = rows * mask.reshape(x.shape[0], -1).to(rows.dtype)
        energy = rows.sum(1)  # (batch,)
        scale = torch.clamp(self.energy_clip / energy.clamp_min(torch.finfo(torch.float64).tiny), max=1.0).sqrt()
        return x * scale.view(-1, *([1] * (x.dim() - 1)))

    def _hook(self, name: str):
        def hook(_module: nn.Module, inputs: tuple) -> None:
            x = inputs[0].detach()
            mask = self.row_mask
            masked = mask is not None and tuple(x.shape[:-1]) == tuple(mask.shape)
            if self.energy_clip is not None:
                x = self._clipped(x, mask if masked else None)
            if masked:
                assert mask is not None
                x = x[mask.to(torch.bool)]  # (kept rows, d_in)
            x = x.reshape(-1, x.shape[-1]).to(torch.float64)  # (rows, d_in)
            g = x.T @ x if self.full[name] else (x * x).sum(dim=0)
            prev = self.grams.get(name)
            self.grams[name] = g if prev is None else prev + g
            self.rows[name] += x.shape[0]

        return hook

    def result(self) -> dict[str, Tensor]:
        """Every module's Gram: what :meth:`recording` summed, and zeros ``(d_in,)`` or ``(d_in, d_in)`` for a
        module that saw no rows (a client with no samples of the task)."""
        grams = dict(self.grams)
        for name, module in self.modules.items():
            if name not in grams:
                assert isinstance(module, (nn.Linear, LoRALinear))  # what Grams are recorded of
                d_in = module.in_features
                shape = (d_in, d_in) if self.full[name] else (d_in,)
                grams[name] = torch.zeros(shape, dtype=torch.float64)
        return grams

    @contextmanager
    def recording(self) -> Iterator[GramRecorder]:
        handles = [m.register_forward_pre_hook(self._hook(name)) for name, m in self.modules.items()]
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
