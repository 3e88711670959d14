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
   (:func:`~server.robust_measures.reweigh`): ``num_samples`` becomes the bound, and every statistic that is a sum over
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
   samples zero and every trained tensor as the plan handed it out (:meth:`~server.robust_screen.Screen.carried`); it is
   folded then, and refused otherwise (a client claiming no samples while it moves the merge).

At most a minority of the updates that hold samples is refused, the farthest past its bound first:
the medians assume an honest majority, and a step must keep one. Three passes over the updates (``observe``,
``judge``, then ``apply`` and fold in index order; a features step one more, ``observe_classes``,
after the centre is known), each loading one update at a time: the coordinator reads them back from
its staging directory, so its memory still does not grow with the number of clients beyond a few
scalars per client and one running sum of changes (of class directions). The
in-process engine runs the same code on the same updates in the same order: both give the same
bits.

Here: the passes over the staged updates and the fold (:func:`screen_and_fold`), and its report's log line
(:func:`robust_text`); the screen, its verdicts and the relative rule in :mod:`server.robust_screen`; what is
measured of each tensor, and how it is scaled or an update reweighed, in :mod:`server.robust_measures`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from common.aggregation.base import Aggregator
from common.run.settings import RobustSettings
from common.wire.messages import ClientUpdate, RoundPlan
from server.robust_screen import Screen, relative_to_median


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
