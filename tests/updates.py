"""A client's update of a coordinator's plan, made up by a test: shared by the coordinator's and the client's tests."""

from __future__ import annotations

import torch

from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import HEAD_BIAS, HEAD_WEIGHT, pack


def plan_update(
    plan: RoundPlan,
    index: int,
    num_samples: int,
    *,
    train_loss: float = float("nan"),
    head_weight: torch.Tensor | None = None,
    head_bias: torch.Tensor | None = None,
    **parts,
) -> ClientUpdate:
    """Client ``index``'s update (id ``c<index>``) of ``plan``'s step, with ``num_samples``, ``train_loss`` and
    its tensors as the shared client halves name them (``common.wire.tensors.pack``: ``factors``, ``grams``,
    ``delta``, ``fisher``, ``stats``, ``head_gram``; and ``head_weight``, ``head_bias``)."""
    head = {HEAD_WEIGHT: head_weight} if head_weight is not None else {}
    head |= {HEAD_BIAS: head_bias} if head_bias is not None else {}
    return ClientUpdate.of_step(plan, index, f"c{index}", num_samples, pack(head=head, **parts), train_loss)
