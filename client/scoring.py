"""How a model is scored, once: the run's clients' evaluation (``client/worker.py``) and the servers of an export
(``serve/model.py``: ``lorm-predict``, ``lorm-serve``) call these, so they cannot drift.

A sample's scores are the method's client half's (:meth:`client.methods.base.ClientMethod.logits`) in the view of
the plan that evaluates the model (``Strategy.eval_plan``: LoRA's merged factors, a dense delta, a closed-form head
on mapped features, prototypes, prompt pools, adapter vectors), over the classes learned so far; the prediction is
their argmax. Every method's half scores so; a new method is served as soon as its clients evaluate.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

import torch
from torch import Tensor

from client.classifier import ClassifierModel
from client.ledger import ClientLedger
from client.methods import ClientMethod, client_method
from client.methods.base import Client, Samples, set_view
from common.run.config import RunConfig
from common.wire.messages import Phase, RoundPlan


def scoring_half(client: Scored, plan: RoundPlan) -> ClientMethod:
    """Set ``client``'s model to the view ``plan`` evaluates (its weights, then ``W0 + extra + view_scale s B A``,
    eval mode) and return the client half that scores in it."""
    if plan.phase != Phase.EVALUATE:
        raise ValueError(f"a {plan.phase.value} plan does not evaluate a model")
    half = client.method.serves(plan)
    client.model.to(client.device)
    half.load(client, plan)
    set_view(client, plan)
    client.model.eval()
    return half


@torch.no_grad()
def seen_logits(half: ClientMethod, client: Scored, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
    """``(batch, seen_classes)``: the half's scores of a batch over the classes learned so far (their argmax is
    the prediction the run's evaluation counts)."""
    return half.logits(client, plan, inputs)[:, : plan.seen_classes]


def trimmed(inputs: dict[str, Tensor], mask: Tensor | None = None) -> dict[str, Tensor]:
    """Tokens ``inputs`` without the padding columns that no row of ``mask`` (default: the batch's own
    ``attention_mask``) uses: the same outputs (the pooling and attention leave padding out), less work. Inputs
    without an attention mask (images) are returned as they are."""
    own = inputs.get("attention_mask")
    if own is None:
        return inputs
    width = max(int((own if mask is None else mask).sum(1).max()), 1)
    return {k: v[:, :width] if v.dim() >= 2 and v.shape[1] == own.shape[1] else v for k, v in inputs.items()}


class Scored(Client, Protocol):
    """What scoring reads of a client: a method's :class:`~client.methods.base.Client` and its half (a client's
    worker is one)."""

    method: ClientMethod


@dataclass
class ServedModel:
    """A model scored outside a run (an export's server): no data, no shard, no ledger. Its half reads only the
    configuration, the model and the plan, as a client's does when it evaluates."""

    config: RunConfig
    model: ClassifierModel
    device: torch.device
    half: ClientMethod | None = None  # the half that scores; None: the run's method's (client_method)
    index: int = 0
    client_id: str = "server"
    shards: list[Tensor] = field(default_factory=list)
    ledger: ClientLedger | None = None
    on_batch: Callable[[int, int], None] | None = None

    def __post_init__(self) -> None:
        self.method = self.half if self.half is not None else client_method(self.config)

    @property
    def train(self) -> Samples:
        raise RuntimeError("a served model has no training samples: scoring read them, which no method's does")
