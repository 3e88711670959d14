"""Bounded influence for poisoned updates: the robust mode (settings section ``robust``), off by default.

Validation (``common.aggregation.validate``) refuses malformed updates; a hostile client can still
send finite, well-formed statistics that move a closed-form merge as far as it likes. With
``robust.enabled`` the step's updates are screened together before any is folded:

1. **Bounds relative to the step's median client**, one per tensor, on a scale where honest clients
   agree whatever their data size:
   - second moments (layer Grams, the head Gram, a statistic's Gram factor): trace per sample,
     ``tr(G_i) / n_i`` (the mean squared norm of the client's inputs);
   - first moments (class sums): Frobenius norm per sample;
   - trained tensors (LoRA factors, dense deltas, the head): the norm of the change from what the
     step handed out, ``||t_i - t_plan||``; the Fisher: its norm (it is a mean already);
   - the claimed sample count ``num_samples`` itself, against the step's median client's: every
     measure above is per *claimed* sample, so a client claiming ten times its samples, with its
     Grams and sums ten times larger to match, would pass them all and take most of the merge;
   - each class count of a features step (``stat/class_count``), against the median class's total
     among the *other* clients: one client must not take over a class's prototype. Not against
     that class's other holders: under Dirichlet beta 0.5 an honest client often holds most of a
     class (on the quick protocol, seeds 0 to 2: a class's largest count is over 2 x the median
     holder's in 70 to 77 % of the classes, up to 17 x), but never more than 0.95 x the others'
     median class total (its claimed count: at most 1.95 x the median client's).
   Over ``kappa`` x the median, ``action='clip'`` scales the tensor down onto the bound (a Gram by
   ``c``, a Gram factor by ``sqrt(c)``, a change by ``c`` around the plan's value) and
   ``action='refuse'`` drops the update from the step. A clipped count *reweighs* the whole update
   (:func:`reweigh`): ``num_samples`` becomes the bound, and every statistic that is a sum over
   samples shrinks with it (Grams by ``w``, their factors by ``sqrt(w)``, each class's count and sum
   by the same ratio, so class means are kept), so that every merge weighs it as that many samples.
2. **Direction**: per trained tensor, the cosine between the client's change and the sum of the
   other clients' changes scaled to unit length (so that one huge change cannot drag the reference
   away from the honest majority); the client's score is the median over its tensors (so that the
   head, whose rows differ by the classes a client holds, does not decide alone). Below
   ``min_cosine``, or below ``relative_cosine`` x the step's median score, the update is dropped:
   a sign-flipped factor has the norm of an honest one, and only its direction gives it away; an
   update trained on wrong labels points the right way, but much less so than the others.
   A features step trains nothing; there the direction is each class's mean, centred on the step's
   centre (the clients' overall means, each client once): per class, the cosine between the
   client's centred mean and the other holders' centred means as unit vectors, summed; the client's
   score is the mean over its classes weighted by its share of each class (what it moves of each
   prototype), under the same two rules (a prototype pulled elsewhere points away from the others).

Every merge here weighs clients by their own statistics (``sum_i B_i A G_i A^T`` against
``sum_i A G_i A^T``), so clipping a client's Gram lowers its weight in numerator and denominator
alike: the merge stays a proper weighted least-squares solution, with that client's weight bounded.

3. **Updates of no samples** (a client on its own data that holds none of the task's classes) are
   kept out of the medians, the sample count's and the directions: they would pull every bound
   towards zero. Such an update adds nothing to the sums when it carries nothing: every sum over
   samples zero and every trained tensor as the plan handed it out (:meth:`Screen.carried`); it is
   folded then, and refused otherwise (a client claiming no samples while it moves the merge).

At most a minority of the updates that hold samples is refused, the farthest past its bound first:
the medians assume an honest majority, and a step must keep one. Three passes over the updates (``observe``,
``judge``, then ``apply`` and fold in index order; a features step one more, ``observe_classes``,
after the centre is known), each loading one update at a time: the coordinator reads them back from
its staging directory, so its memory still does not grow with the number of clients beyond a few
scalars per client and one running sum of changes (of class directions). The
in-process engine runs the same code on the same updates in the same order: both give the same
bits.
"""

from __future__ import annotations

import dataclasses
import math
import statistics
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.aggregation.declared import GRAM_FACTOR
from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    LORA,
    STAT,
    parse_tensor_name,
    tensor_name,
)

SECOND, FIRST, CHANGE, NORM, COUNT = "second moment", "first moment", "change", "norm", "count"
SAMPLES = "num_samples"  # the verdict's key for the update's claimed sample count (its reweighing)
CLASS_SUM, CLASS_COUNT = tensor_name(STAT, "class_sum"), tensor_name(STAT, "class_count")


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
    for layer, low_rank in plan.low_rank(LORA).items():
        starts[tensor_name(FACTOR, layer, "B")] = low_rank.b
        starts[tensor_name(FACTOR, layer, "A")] = low_rank.a
    return starts | {name: t for name, t in plan.tensors.items() if name in (HEAD_WEIGHT, HEAD_BIAS)}


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


def is_sum(name: str, tensor: Tensor) -> bool:
    """Whether ``name`` is a sum over the client's samples (zero when it has none): a Gram or Gram factor, a
    class count, or a class's sums (``stat/<prefix>class_*``), as :func:`reweigh` scales them."""
    kind, layer, _ = parse_tensor_name(name)
    return tensor_role(name, tensor) == SECOND or (kind == STAT and layer is not None and "class_" in layer)


def is_count(name: str) -> bool:
    """Whether a bound's ``name`` is a count (the claimed samples, or a class count), not a tensor's."""
    return name == SAMPLES or name.startswith(CLASS_COUNT)


def apportion(counts: Tensor, total: int) -> Tensor:
    """Whole counts proportional to ``counts: (C,)`` that sum to ``total`` (largest remainders, ties to
    the lower class); a class with no count keeps none."""
    if float(counts.sum()) <= 0.0:
        return counts.clone()
    exact = counts.to(torch.float64) * (total / float(counts.sum()))
    whole = exact.floor()
    short = int(total - float(whole.sum()))
    if short > 0:
        order = sorted(range(len(exact)), key=lambda k: (-float(exact[k] - whole[k]), k))
        for k in order[:short]:
            whole[k] += 1.0
    return whole.to(counts.dtype)


def reweigh(update: ClientUpdate, samples: int) -> ClientUpdate:
    """``update`` as the statistics of ``samples`` samples instead of its ``num_samples``: with
    ``w = samples / num_samples``, every Gram times ``w`` (a Gram factor ``sqrt(w)``), each class count
    apportioned to sum to ``samples`` (held-out counts in the same ratio per class, never above the
    class's count) and each class's sums (``stat/<prefix>class_*``) scaled as its count, so that its
    class means stay as they were; trained tensors, means (a Fisher, prototypes) and the loss are not
    sums over samples and stay. The attacks of ``engine.attacks`` inflate with it (``w > 1``); the
    guard clips a count with it (``w < 1``)."""
    if samples == update.num_samples:
        return update
    w = samples / max(update.num_samples, 1)
    tensors = dict(update.tensors)
    ratios: dict[str, Tensor] = {}  # count name -> per-class ratio new / old
    counts = {name: t for name, t in tensors.items() if tensor_role(name, t) == COUNT and name.startswith(STAT + "/")}
    main = counts.get(CLASS_COUNT)
    for name, count in counts.items():
        if name == CLASS_COUNT or main is None or count.shape != main.shape:
            new = apportion(count, samples) if name == CLASS_COUNT else apportion(count, round(float(count.sum()) * w))
        else:  # held-out counts: the main count's ratio per class, whole, never above it
            kept = apportion(main, samples)
            new = torch.minimum((count.to(torch.float64) * kept / main.clamp(min=1)).floor().to(count.dtype), kept)
        ratios[name] = torch.where(count > 0, new.to(torch.float64) / count.clamp(min=1), 0.0)
        tensors[name] = new
    for name, t in tensors.items():
        role = tensor_role(name, t)
        if name in counts:
            continue
        count_name = name[: name.rfind("class_")] + "class_count" if "class_" in name else ""
        if role in (FIRST, SECOND) and count_name in ratios and t.shape[:1] == ratios[count_name].shape:
            ratio = ratios[count_name].reshape(-1, *([1] * (t.dim() - 1)))  # (C, 1, ...): each class's rows
            tensors[name] = (t.to(torch.float64) * ratio).to(t.dtype)
        elif role == SECOND:
            tensors[name] = scaled(name, t, {}, w)
    return dataclasses.replace(dataclasses.replace(update, tensors=tensors), num_samples=samples)


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
        """The client's class means against the other holders' (see the module's docstring); NaN when it
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
    if screen.has_classes:  # the centre is known now: the class directions
        for i in indices:
            screen.observe_classes(load(i))
    verdicts = {i: screen.judge(load(i)) for i in indices}
    relative_to_median(settings, verdicts)
    # The medians assume an honest majority of the updates they measure: never drop more than a minority of
    # them, the worst first (an update of no samples that carries something is refused in any case).
    measured = [i for i in indices if i not in screen.empty]
    most = (len(measured) - 1) // 2
    worst = sorted((i for i in measured if verdicts[i].refused), key=lambda i: (-verdicts[i].severity, i))
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
