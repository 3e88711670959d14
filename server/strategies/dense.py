"""What the full fine-tuning baselines share: a dense global backbone delta, and update checks.

These methods (FedAvg, RegMean, Fisher averaging, TIES) train every backbone weight with the
same ACE loss, head and data as LoRM. The model they hold is ``W = W0 + delta`` per backbone
parameter (``ModelSpec.params``) with the merged head; clients receive ``delta`` in every
plan (``mode="full"``) and send back their own ``delta_i`` = trained minus received weights.
Each round the strategy merges the ``delta_i`` into a step and adds it to ``delta``.

There is no low-rank adapter: :meth:`DenseStrategy.adapter` is empty and
:meth:`DenseStrategy.dense_delta` returns ``delta``.
"""

from __future__ import annotations

from dataclasses import replace

import torch
from torch import Tensor

from common.config import RunConfig
from common.messages import ClientUpdate, LowRank, ModelSpec, Phase, RoundPlan
from server.strategies.base import Strategy, UpdateRejected, check_head

HEAD_FISHER = ("head.weight", "head.bias")  # the head's entries of ClientUpdate.fisher


def _check_finite(field: str, t: Tensor) -> None:
    if not bool(torch.isfinite(t).all()):
        raise UpdateRejected(field, "must be finite, got NaN or inf entries")


def _check_names(field: str, got: set[str], want: set[str], what: str) -> None:
    if got != want:
        missing, unknown = sorted(want - got)[:3], sorted(got - want)[:3]
        raise UpdateRejected(field, f"expected {what} (missing {missing}, unknown {unknown})")


def check_delta(update: ClientUpdate, spec: ModelSpec) -> None:
    """A finite delta of the right shape for every backbone parameter, and nothing else."""
    _check_names("delta", set(update.delta), set(spec.params), "one delta per backbone parameter")
    for name, shape in spec.params.items():
        got = update.delta[name]
        if tuple(got.shape) != tuple(shape):
            raise UpdateRejected(f"delta[{name}]", f"expected shape {tuple(shape)}, got {tuple(got.shape)}")
        _check_finite(f"delta[{name}]", got)


def check_dense_head(update: ClientUpdate, spec: ModelSpec) -> None:
    check_head(update, spec)
    _check_finite("head_weight", update.head_weight)
    _check_finite("head_bias", update.head_bias)


def check_fisher(update: ClientUpdate, spec: ModelSpec) -> None:
    """A finite, non-negative diagonal Fisher per backbone parameter and for the head."""
    shapes = dict(spec.params) | {HEAD_FISHER[0]: (spec.num_classes, spec.feature_dim),
                                  HEAD_FISHER[1]: (spec.num_classes,)}
    _check_names("fisher", set(update.fisher), set(shapes), "a Fisher per backbone parameter and the head")
    for name, shape in shapes.items():
        got = update.fisher[name]
        if tuple(got.shape) != tuple(shape):
            raise UpdateRejected(f"fisher[{name}]", f"expected shape {tuple(shape)}, got {tuple(got.shape)}")
        _check_finite(f"fisher[{name}]", got)
        if bool((got < 0).any()):
            raise UpdateRejected(f"fisher[{name}]", f"must be non-negative, got minimum {float(got.min())}")


def head_delta(update: ClientUpdate, plan: RoundPlan) -> tuple[Tensor, Tensor]:
    """The client's head change ``(w_i - w_g, b_i - b_g)``, float64.

    Taken against the plan's head cast to the update's dtype (what the client actually started
    from), so that rows the client did not train give exact zeros rather than rounding noise.
    """
    assert update.head_weight is not None and update.head_bias is not None
    assert plan.head_weight is not None and plan.head_bias is not None
    w, b = update.head_weight, update.head_bias
    return ((w - plan.head_weight.to(w.dtype)).to(torch.float64),
            (b - plan.head_bias.to(b.dtype)).to(torch.float64))


class DenseStrategy(Strategy):
    """A full fine-tuning baseline: state ``delta`` (float32 per backbone parameter) + head."""

    def __init__(self, config: RunConfig, spec: ModelSpec) -> None:
        super().__init__(config, spec)
        if not spec.params:
            raise ValueError(f"strategy {self.name!r} fine-tunes the whole backbone: the model spec must list "
                             "its parameters (ModelSpec.params), got none")
        self.delta: dict[str, Tensor] = {name: torch.zeros(shape, dtype=torch.float32)
                                         for name, shape in spec.params.items()}

    def plan_options(self) -> dict:
        """What clients must send besides the delta and head (``RoundPlan`` fields)."""
        return {}

    def configure(self, task: int, round_: int, phase: Phase) -> RoundPlan:
        if phase != Phase.TRAIN:
            raise ValueError(f"strategy {self.name!r} has no {phase} step")
        return self.base_plan(task, round_, phase, mode="full", delta=self.delta, **self.plan_options())

    def eval_plan(self, task: int) -> RoundPlan:
        """Evaluate ``W0 + delta`` with the current head."""
        return replace(super().eval_plan(task), mode="full", delta=self.delta)

    def add_to_delta(self, step: dict[str, Tensor]) -> None:
        """``delta <- delta + step`` (summed in float64, stored as float32); new tensors, so
        plans already handed out keep the delta they were made with."""
        self.delta = {name: (d.to(torch.float64) + step[name]).to(torch.float32) for name, d in self.delta.items()}

    def state_tensors(self) -> dict[str, Tensor]:
        return super().state_tensors() | {f"delta/{name}": d for name, d in self.delta.items()}

    def load_state_tensors(self, tensors: dict[str, Tensor]) -> None:
        super().load_state_tensors(tensors)
        self.delta = {name: tensors[f"delta/{name}"] for name in self.spec.params}

    def adapter(self) -> dict[str, LowRank]:
        return {}

    def dense_delta(self) -> dict[str, Tensor]:
        return self.delta
