"""Bounded influence for poisoned updates: the robust mode (settings section ``robust``), off by default.

Validation (``server.strategies.validate``) refuses malformed updates; a hostile client can still
send finite, well-formed statistics that move a closed-form merge as far as it likes. With
``robust.enabled`` the step's updates are screened together before any is folded:

1. **Bounds relative to the step's median client**, one per tensor, on a scale where honest clients
   agree whatever their data size:
   - second moments (layer Grams, the head Gram, a statistic's Gram factor): trace per sample,
     ``tr(G_i) / n_i`` (the mean squared norm of the client's inputs);
   - first moments (class sums): Frobenius norm per sample;
   - trained tensors (LoRA factors, dense deltas, the head): the norm of the change from what the
     step handed out, ``||t_i - t_plan||``; the Fisher: its norm (it is a mean already);
   - counts are left alone (validation ties them to ``num_samples``).
   Over ``kappa`` x the median, ``action='clip'`` scales the tensor down onto the bound (a Gram by
   ``c``, a Gram factor by ``sqrt(c)``, a change by ``c`` around the plan's value) and
   ``action='refuse'`` drops the update from the step.
2. **Direction**: per trained tensor, the cosine between the client's change and the sum of the
   other clients' changes scaled to unit length (so that one huge change cannot drag the reference
   away from the honest majority); the client's score is the median over its tensors (so that the
   head, whose rows differ by the classes a client holds, does not decide alone). Below
   ``min_cosine``, or below ``relative_cosine`` x the step's median score, the update is dropped:
   a sign-flipped factor has the norm of an honest one, and only its direction gives it away; an
   update trained on wrong labels points the right way, but much less so than the others.

Every merge here weighs clients by their own statistics (``sum_i B_i A G_i A^T`` against
``sum_i A G_i A^T``), so clipping a client's Gram lowers its weight in numerator and denominator
alike: the merge stays a proper weighted least-squares solution, with that client's weight bounded.

At most a minority of a step's updates is refused, the farthest past its bound first: the medians
assume an honest majority, and a step must keep one. Three passes over the updates (``observe``,
``judge``, then ``apply`` and fold in index order), each loading one update at a time: the
coordinator reads them back from its staging directory, so its memory still does not grow with
the number of clients beyond a few scalars per client and one running sum of changes. The
in-process engine runs the same code on the same updates in the same order: both give the same
bits.
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any, Callable

import torch
from torch import Tensor

from common.declared import GRAM_FACTOR
from common.messages import ClientUpdate, RoundPlan
from common.settings import RobustSettings
from common.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    STAT,
    parse_tensor_name,
    tensor_name,
    update_tensors,
    with_tensors,
)
from server.strategies.base import Aggregator

SECOND, FIRST, CHANGE, NORM, COUNT = "second moment", "first moment", "change", "norm", "count"


def tensor_role(name: str, tensor: Tensor) -> str:
    """How the guard measures the tensor ``name`` of an update (one of the roles above)."""
    kind, layer, _ = parse_tensor_name(name)
    if name == HEAD_GRAM or kind == GRAM:
        return SECOND
    if kind == STAT:
        assert layer is not None
        if layer.endswith("count"):
            return COUNT
        is_square = tensor.dim() == 2 and tensor.shape[0] == tensor.shape[1]
        return SECOND if layer.endswith(GRAM_FACTOR) or is_square else FIRST
    if kind in (FACTOR, DELTA) or name in (HEAD_WEIGHT, HEAD_BIAS):
        return CHANGE
    if kind == FISHER:
        return NORM
    return COUNT  # nothing else is summed: leave it as sent


def plan_starts(plan: RoundPlan) -> dict[str, Tensor]:
    """What each trained tensor started from in this step, under the update's names (a dense
    ``delta`` is a change already; factors a plan does not hand out start at zero)."""
    starts: dict[str, Tensor] = {}
    for layer, low_rank in plan.lora.items():
        starts[tensor_name(FACTOR, layer, "B")] = low_rank.b
        starts[tensor_name(FACTOR, layer, "A")] = low_rank.a
    if plan.head_weight is not None:
        starts[HEAD_WEIGHT] = plan.head_weight
    if plan.head_bias is not None:
        starts[HEAD_BIAS] = plan.head_bias
    return starts


def change(name: str, tensor: Tensor, starts: dict[str, Tensor]) -> Tensor:
    """``tensor`` minus its start (float64), or the tensor itself when nothing started it."""
    start = starts.get(name)
    t = tensor.to(torch.float64)
    return t - start.to(tensor.dtype).to(torch.float64) if start is not None and start.shape == tensor.shape else t


def scaled(name: str, tensor: Tensor, starts: dict[str, Tensor], factor: float) -> Tensor:
    """``tensor`` with its :func:`measure` times ``|factor|``: a change scaled around its start, a
    Gram factor by ``sqrt(factor)`` (so that its Gram is times ``factor``), anything else times ``factor``."""
    role = tensor_role(name, tensor)
    if role == CHANGE:
        moved = change(name, tensor, starts)
        return (tensor.to(torch.float64) - moved + moved * factor).to(tensor.dtype)  # start + factor (t - start)
    if role == SECOND and name.endswith(GRAM_FACTOR):
        return tensor * math.sqrt(factor)
    return tensor * factor


def measure(role: str, name: str, tensor: Tensor, starts: dict[str, Tensor], samples: int) -> float:
    """The scalar the bound applies to (see the module's docstring)."""
    t = tensor.to(torch.float64)
    per_sample = 1.0 / max(samples, 1)
    if role == SECOND:
        if name.endswith(GRAM_FACTOR):
            return float(t.square().sum()) * per_sample  # tr(R^T R)
        return float((t if t.dim() == 1 else t.diagonal()).sum()) * per_sample
    if role == FIRST:
        return float(t.norm()) * per_sample
    if role == CHANGE:
        return float(change(name, tensor, starts).norm())
    return float(t.norm())


@dataclass
class Verdict:
    """What the guard did with one client's update."""

    index: int
    refused: str = ""  # why the update was dropped ("" when it was folded)
    clipped: dict[str, float] = field(default_factory=dict)  # tensor name -> the scale applied (< 1)
    cosine: float = float("nan")  # its change against the other clients' summed change
    ratio: float = 0.0  # its largest measure over the step's median, across its tensors (what kappa bounds)
    severity: float = 0.0  # how far past its bound a refused update is (the worst are refused first)
    spared: bool = False  # over a bound, but kept: refusing it would have left no honest majority

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "cosine": None if math.isnan(self.cosine) else round(self.cosine, 4),
            "ratio": float(f"{self.ratio:.4g}"),
        }
        if self.refused:
            out["refused"] = self.refused
        if self.spared:
            out["spared"] = True
        if self.clipped:
            out["clipped"] = {name: float(f"{scale:.4g}") for name, scale in sorted(self.clipped.items())}
        return out


class Screen:
    """One step's screening: :meth:`observe` every update, then :meth:`judge` and :meth:`apply` each."""

    def __init__(self, settings: RobustSettings, plan: RoundPlan) -> None:
        self.settings = settings
        self.starts = plan_starts(plan)
        self.values: dict[str, dict[int, float]] = {}  # tensor name -> client index -> measure
        self.total: dict[str, Tensor] = {}  # tensor name -> sum of the clients' unit changes (float64)
        self.medians: dict[str, float] = {}

    def changes(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """An update's change per trained tensor (float64), scaled to unit norm (zero changes left out),
        from its flattened ``tensors`` (``update_tensors``)."""
        moved = {}
        for name, t in tensors.items():
            if tensor_role(name, t) == CHANGE:
                d = change(name, t, self.starts)
                norm = float(d.norm())
                if norm > 0.0:
                    moved[name] = d / norm
        return moved

    def observe(self, update: ClientUpdate) -> None:
        tensors = update_tensors(update)
        for name, tensor in tensors.items():
            role = tensor_role(name, tensor)
            if role != COUNT:
                self.values.setdefault(name, {})[update.client_index] = measure(
                    role, name, tensor, self.starts, update.num_samples
                )
        for name, unit in self.changes(tensors).items():  # unit directions: however large, one client counts once
            self.total[name] = self.total[name] + unit if name in self.total else unit

    def _median(self, name: str) -> float:
        if name not in self.medians:
            self.medians[name] = statistics.median(self.values[name].values())
        return self.medians[name]

    def judge(self, update: ClientUpdate) -> Verdict:
        """The verdict on an observed update: its cosine, then each tensor against its bound."""
        i, kappa = update.client_index, self.settings.kappa
        verdict = Verdict(i)
        tensors = update_tensors(update)
        cosines = []
        for name, unit in self.changes(tensors).items():
            rest = self.total[name] - unit  # the other clients' unit directions of this tensor, summed
            norm = float(rest.norm())
            if norm > 0.0:
                cosines.append(float((unit * rest).sum()) / norm)
        over: list[tuple[float, str, float, float]] = []  # (value / bound, name, value, bound)
        for name in sorted(tensors):
            if name not in self.values or i not in self.values[name]:
                continue
            median = self._median(name)
            value, bound = self.values[name][i], kappa * median
            if median > 0.0:
                verdict.ratio = max(verdict.ratio, value / median)
            if value > bound > 0.0:
                over.append((value / bound, name, value, bound))
        if cosines:  # the median over tensors: a layer or the head alone does not decide
            verdict.cosine = statistics.median(cosines)
            if verdict.cosine < self.settings.min_cosine:
                verdict.severity = self.settings.min_cosine - verdict.cosine
                verdict.refused = (
                    f"its change points away from the other clients' (cosine {verdict.cosine:.3f} "
                    f"< robust.min_cosine {self.settings.min_cosine})"
                )
                return verdict
        if over and self.settings.action == "refuse":
            excess, name, value, bound = max(over)
            verdict.severity = math.log(excess)
            verdict.refused = (
                f"{name}: its {tensor_role(name, tensors[name])} measure {value:.4g} exceeds robust.kappa {kappa:g} "
                f"x the step's median ({bound:.4g})"
            )
            return verdict
        verdict.clipped = {name: bound / value for _, name, value, bound in over}
        return verdict

    def apply(self, update: ClientUpdate, verdict: Verdict) -> ClientUpdate:
        """``update`` with every clipped tensor scaled onto its bound (the update itself when none is)."""
        if not verdict.clipped:
            return update
        tensors = update_tensors(update)
        for name, scale in verdict.clipped.items():
            tensors[name] = scaled(name, tensors[name], self.starts, scale)
        return with_tensors(update, tensors)


def relative_to_median(settings: RobustSettings, verdicts: dict[int, Verdict]) -> None:
    """Refuse each update whose cosine is below ``relative_cosine`` x the step's median cosine (when
    that median is positive): an update trained on wrong labels keeps an honest norm and a positive
    cosine, but agrees with the others far less than the typical client does."""
    cosines = [v.cosine for v in verdicts.values() if not math.isnan(v.cosine)]
    if not cosines or settings.relative_cosine <= 0.0:
        return
    median = statistics.median(cosines)
    floor = settings.relative_cosine * median
    if median <= 0.0:
        return
    for verdict in verdicts.values():
        if not verdict.refused and verdict.cosine < floor:
            verdict.severity = (floor - verdict.cosine) / median
            verdict.clipped = {}
            verdict.refused = (
                f"its change agrees with the other clients' far less than the step's median client's (cosine "
                f"{verdict.cosine:.3f} < robust.relative_cosine {settings.relative_cosine:g} x {median:.3f})"
            )


def screen_and_fold(
    settings: RobustSettings,
    plan: RoundPlan,
    aggregator: Aggregator,
    indices: list[int],
    load: Callable[[int], ClientUpdate],
) -> dict[str, Any]:
    """Screen the updates of clients ``indices`` (loaded one at a time by ``load``) and fold what
    passes, in index order; returns the report for the step's history entry (``robust``)."""
    indices = sorted(indices)
    if len(indices) < settings.min_clients:
        for i in indices:
            aggregator.fold(load(i), checked=True)
        return {"screened": False, "why": f"{len(indices)} updates < robust.min_clients {settings.min_clients}"}
    screen = Screen(settings, plan)
    for i in indices:
        screen.observe(load(i))
    verdicts = {i: screen.judge(load(i)) for i in indices}
    relative_to_median(settings, verdicts)
    # The medians assume an honest majority: never drop more than a minority, the worst first.
    most = (len(indices) - 1) // 2
    worst = sorted((i for i in indices if verdicts[i].refused), key=lambda i: (-verdicts[i].severity, i))
    for i in worst[most:]:
        verdicts[i].refused, verdicts[i].spared = "", True
    for i in indices:
        if not verdicts[i].refused:
            update = load(i)
            aggregator.fold(screen.apply(update, verdicts[i]), checked=True)
    return {
        "screened": True,
        "refused": [i for i in indices if verdicts[i].refused],
        "clipped": [i for i in indices if verdicts[i].clipped and not verdicts[i].refused],
        "spared": [i for i in indices if verdicts[i].spared],
        "clients": {str(i): verdicts[i].to_dict() for i in indices},
    }


def robust_text(report: dict[str, Any]) -> str:
    """One log line's worth of a screening report ("" when nothing was refused or clipped)."""
    if not report.get("screened"):
        return f"; not screened: {report['why']}" if "why" in report else ""
    parts = []
    for i in report.get("spared", []):
        parts.append(f"client {i} over a bound but kept (refusing it would leave no honest majority)")
    for i in report["refused"]:
        parts.append(f"client {i} refused: {report['clients'][str(i)]['refused']}")
    for i in report["clipped"]:
        names = report["clients"][str(i)]["clipped"]
        parts.append(f"client {i} clipped ({len(names)} tensors, smallest scale {min(names.values()):.3g})")
    return "; robust: " + "; ".join(parts) if parts else "; robust: all kept"
