"""Synthetic client updates of real shapes and dtypes, for benchmarks and load tests.

ViT-B/16 (12 blocks) with LoRA on ``attn.qkv (2304, 768)``, ``attn.proj (768, 768)``,
``mlp.fc1 (3072, 768)``, ``mlp.fc2 (768, 3072)`` as ``(d_out, d_in)``, a 100-class head on
768 features. A LoRM update holds the trained factor per layer (``B: (d_out, r)`` or
``A: (r, d_in)``, float32), ``diag(G): (d_in,)`` float64 per layer, the head weight
``(classes, features)`` and bias float32, and the head Gram ``(features, features)`` float64.
Values are seeded by the client index, so two processes build the same update.
"""

from __future__ import annotations

import torch

from common.wire.instructions import LoraStep
from common.wire.messages import ClientUpdate, ModelSpec, RoundPlan
from common.wire.tensors import head_tensors, pack

BLOCKS, CLASSES, FEATURES = 12, 100, 768
SHAPES = {"attn.qkv": (2304, 768), "attn.proj": (768, 768), "mlp.fc1": (3072, 768), "mlp.fc2": (768, 3072)}
LAYERS = {f"blocks.{b}.{name}": shape for b in range(BLOCKS) for name, shape in SHAPES.items()}
VIT_B16 = ModelSpec(LAYERS, feature_dim=FEATURES, num_classes=CLASSES)
TINY = ModelSpec({"l1": (6, 4), "l2": (4, 6)}, feature_dim=4, num_classes=6)  # for quick tests


def update_bytes(spec: ModelSpec, rank: int, factors: tuple[str, ...] = ("B",)) -> int:
    """Tensor bytes of one :func:`make_update` (its ``ClientUpdate.nbytes``)."""
    per_layer = sum(
        (d_out * rank if "B" in factors else 0) * 4 + (rank * d_in if "A" in factors else 0) * 4 + d_in * 8
        for d_out, d_in in spec.layers.values()
    )
    head = (spec.num_classes * spec.feature_dim + spec.num_classes) * 4 + spec.feature_dim**2 * 8
    return per_layer + head


def make_update(plan: RoundPlan, index: int, rank: int, spec: ModelSpec = VIT_B16) -> ClientUpdate:
    """Client ``index``'s update for ``plan`` (a training step): seeded random tensors of the real shapes."""
    gen = torch.Generator().manual_seed(1000 + index)
    features = spec.feature_dim
    head_gram = torch.rand(features, features, generator=gen, dtype=torch.float64)
    head_gram = head_gram @ head_gram.T  # symmetric positive semi-definite, like a real Gram
    shapes = {"B": lambda d_out, d_in: (d_out, rank), "A": lambda d_out, d_in: (rank, d_in)}
    tensors = pack(
        factors={
            name: {
                f: torch.randn(*shapes[f](d_out, d_in), generator=gen) * 1e-2
                for f in plan.expect(LoraStep).train_factors
            }
            for name, (d_out, d_in) in spec.layers.items()
        },
        grams={
            name: torch.rand(d_in, generator=gen, dtype=torch.float64) * 100 for name, (_, d_in) in spec.layers.items()
        },
        head=head_tensors(
            torch.randn(spec.num_classes, features, generator=gen) * 1e-2,
            torch.randn(spec.num_classes, generator=gen) * 1e-2,
        ),
        head_gram=head_gram,
    )
    return ClientUpdate.of_step(plan, index, f"c{index}", 100 + index % 7, tensors, 1.0)
