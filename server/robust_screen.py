"""The robust mode's screen of one step's updates (``server/robust.py``): the bounds and the direction test.

:class:`Screen` observes every update (a few scalars per client, one running sum of unit changes, of class
directions), then judges each into a :class:`Verdict` (its cosine against the other clients', each measure against
``kappa`` x the step's median: refused, clipped or kept) and applies what it clipped; :func:`relative_to_median`
refuses, over all the verdicts, the updates that agree with the others far less than the median client does. What
is measured of a tensor and how it is scaled is :mod:`server.robust_measures`'; the passes over the staged
updates, the honest majority kept and the fold are :func:`server.robust.screen_and_fold`'s.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import DELTA
from server.robust_measures import (
    CHANGE,
    CLASS_COUNT,
    CLASS_SUM,
    COUNT,
    SAMPLES,
    change,
    is_count,
    is_sum,
    measure,
    plan_starts,
    reweigh,
    scaled,
    tensor_role,
)


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
    """One step's screening: :meth:`observe` every update (then :meth:`observe_classes` each, when
    :attr:`has_classes`), then :meth:`judge` and :meth:`apply` each."""

    def __init__(self, settings: RobustSettings, plan: RoundPlan) -> None:
        self.settings = settings
        self.starts = plan_starts(plan)
        self.values: dict[str, dict[int, float]] = {}  # tensor name -> client index -> measure
        self.total: dict[str, Tensor] = {}  # tensor name -> sum of the clients' unit changes (float64)
        self.medians: dict[str, float] = {}
        self.samples: dict[int, int] = {}  # client index -> its claimed num_samples
        self.class_total: Tensor | None = None  # (C_t,) every client's class counts, summed
        self.centre_sum: Tensor | None = None  # (F',) the clients' overall feature means, summed
        self.centres = 0  # how many clients the centre sums
        self.directions: Tensor | None = None  # (C_t, F') per class, the clients' unit centred class means, summed
        self.empty: dict[int, str] = {}  # client index of an update of no samples -> what it carries ("": nothing)

    @property
    def has_classes(self) -> bool:
        return self.class_total is not None

    def changes(self, tensors: dict[str, Tensor]) -> dict[str, Tensor]:
        """An update's change per trained tensor (float64), scaled to unit norm (zero changes left out),
        from its flattened ``tensors`` (``ClientUpdate.tensors``)."""
        moved = {}
        for name, t in tensors.items():
            if tensor_role(name, t) == CHANGE:
                d = change(name, t, self.starts)
                norm = float(d.norm())
                if norm > 0.0:
                    moved[name] = d / norm
        return moved

    def carried(self, update: ClientUpdate) -> str:
        """For an update of no samples: ``""`` when it carries nothing (every sum over samples zero, every
        trained tensor whose start the plan holds, or that is a change itself, unchanged), else what it carries."""
        for name, tensor in update.tensors.items():
            if is_sum(name, tensor):
                moved = tensor
            elif tensor_role(name, tensor) == CHANGE and (name in self.starts or name.startswith(DELTA + "/")):
                moved = change(name, tensor, self.starts)
            else:
                continue
            if bool((moved != 0).any()):
                return f"it claims no samples but carries {name} (norm {float(moved.to(torch.float64).norm()):.4g})"
        return ""

    def observe(self, update: ClientUpdate) -> None:
        if update.num_samples == 0:  # kept out of every median and direction
            self.empty[update.client_index] = self.carried(update)
            return
        tensors = dict(update.tensors)
        self.samples[update.client_index] = update.num_samples
        for name, tensor in tensors.items():
            role = tensor_role(name, tensor)
            if role != COUNT:
                self.values.setdefault(name, {})[update.client_index] = measure(
                    role, name, tensor, self.starts, update.num_samples
                )
        for name, unit in self.changes(tensors).items():  # unit directions: however large, one client counts once
            self.total[name] = self.total[name] + unit if name in self.total else unit
        if CLASS_COUNT in tensors and CLASS_SUM in tensors:
            counts, sums = tensors[CLASS_COUNT].to(torch.float64), tensors[CLASS_SUM].to(torch.float64)
            self.class_total = counts if self.class_total is None else self.class_total + counts
            overall = sums.sum(0) / max(float(counts.sum()), 1.0)  # (F',) the client's mean feature
            self.centre_sum = overall if self.centre_sum is None else self.centre_sum + overall
            self.centres += 1

    def class_directions(self, tensors: dict[str, Tensor]) -> Tensor:
        """``(C_t, F')``: the client's class means minus the step's centre, each of unit length (a class it
        does not hold, or one at the centre, is zero)."""
        assert self.centre_sum is not None
        counts, sums = tensors[CLASS_COUNT].to(torch.float64), tensors[CLASS_SUM].to(torch.float64)
        centred = sums / counts.clamp(min=1.0)[:, None] - self.centre_sum / self.centres  # (C_t, F')
        norms = centred.norm(dim=1, keepdim=True)
        return torch.where((counts[:, None] > 0) & (norms > 0), centred / norms.clamp(min=1e-300), 0.0)

    def observe_classes(self, update: ClientUpdate) -> None:
        """The second pass of a features step: the client's unit class directions into the per-class sums."""
        tensors = dict(update.tensors)
        if update.num_samples and CLASS_COUNT in tensors and CLASS_SUM in tensors:
            units = self.class_directions(tensors)
            self.directions = units if self.directions is None else self.directions + units

    def class_score(self, tensors: dict[str, Tensor]) -> float:
        """The client's class means against the other holders' (see ``server/robust.py``'s docstring); NaN when it
        shares no class with another client."""
        assert self.directions is not None and self.class_total is not None
        counts = tensors[CLASS_COUNT].to(torch.float64)
        units = self.class_directions(tensors)
        rest = self.directions - units  # (C_t, F') the other holders' unit directions, summed
        norms = rest.norm(dim=1)
        mine = (counts > 0) & (norms > 0) & (units.norm(dim=1) > 0)
        if not bool(mine.any()):
            return float("nan")
        cosines = (units * rest).sum(1)[mine] / norms[mine]
        share = counts[mine] / self.class_total[mine]  # what it moves of each class's prototype
        return float((cosines * share).sum() / share.sum())

    def _median(self, name: str) -> float:
        if name not in self.medians:
            self.medians[name] = statistics.median(self.values[name].values())
        return self.medians[name]

    def count_bounds(self, i: int, tensors: dict[str, Tensor]) -> list[tuple[str, float, float, float]]:
        """``(what, value, bound, median)`` for the update's claimed sample count and each of its class
        counts: at most ``kappa`` x the step's median client's count, and a class at most ``kappa`` x the
        median class's total among the other clients (whole numbers: a count is one)."""
        kappa = self.settings.kappa
        median = statistics.median(self.samples.values())
        out = [(SAMPLES, float(self.samples[i]), float(max(1, math.floor(kappa * median))), median)]
        if self.class_total is not None and CLASS_COUNT in tensors:
            counts = tensors[CLASS_COUNT].to(torch.float64)
            others = statistics.median((self.class_total - counts).tolist())
            bound = float(max(1, math.floor(kappa * others)))
            k = int(counts.argmax())
            out.append((f"{CLASS_COUNT}[{k}]", float(counts[k]), bound, others))
        return out

    def judge(self, update: ClientUpdate) -> Verdict:
        """The verdict on an observed update: its cosine, then each tensor and count against its bound."""
        i, kappa = update.client_index, self.settings.kappa
        verdict = Verdict(i)
        if i in self.empty:  # nothing to measure: it adds nothing, or it is refused for what it carries
            verdict.refused, verdict.severity = self.empty[i], math.inf if self.empty[i] else 0.0
            return verdict
        tensors = dict(update.tensors)
        cosines = []
        for name, unit in self.changes(tensors).items():
            rest = self.total[name] - unit  # the other clients' unit directions of this tensor, summed
            norm = float(rest.norm())
            if norm > 0.0:
                cosines.append(float((unit * rest).sum()) / norm)
        if self.directions is not None and CLASS_COUNT in tensors and CLASS_SUM in tensors:
            score = self.class_score(tensors)
            if not math.isnan(score):
                cosines.append(score)
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
        for name, value, bound, median in self.count_bounds(i, tensors):
            if median > 0.0:
                verdict.ratio = max(verdict.ratio, value / median)
            if value > bound:
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
            what = "count" if is_count(name) else tensor_role(name, tensors[name])
            verdict.refused = (
                f"{name}: its {what} measure {value:.4g} exceeds robust.kappa {kappa:g} "
                f"x the step's median ({bound:.4g})"
            )
            return verdict
        verdict.clipped = {name: bound / value for _, name, value, bound in over if not is_count(name)}
        counted = [bound / value for _, name, value, bound in over if is_count(name)]
        if counted:  # one weight for the whole update: the smallest its counts need, whole samples
            verdict.clipped[SAMPLES] = max(1, math.floor(update.num_samples * min(counted))) / update.num_samples
        return verdict

    def apply(self, update: ClientUpdate, verdict: Verdict) -> ClientUpdate:
        """``update`` with every clipped tensor scaled onto its bound and, when a count was over its bound,
        reweighed onto it (:func:`reweigh`); the update itself when nothing is clipped."""
        if not verdict.clipped:
            return update
        tensors = dict(update.tensors)
        for name, scale in verdict.clipped.items():
            if name != SAMPLES:
                tensors[name] = scaled(name, tensors[name], self.starts, scale)
        clipped = dataclasses.replace(update, tensors=tensors)
        if SAMPLES in verdict.clipped:
            clipped = reweigh(clipped, round(update.num_samples * verdict.clipped[SAMPLES]))
        return clipped


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
