"""What secure aggregation asks of a method, and how the coordinator takes in an unmasked sum.

A step's aggregator keeps running sums of per-client terms (``common/merges/sums.py``). The coordinator loads
the survivors' unmasked sum into a fresh aggregator of the step (:func:`load_sums`) and checks it
(:func:`check_sums`), since it can no longer check one update; methods whose merge needs an individual
update (TIES' sign election, PILoRA's per-client prototypes, the robust mode's screening) refuse before
the run starts (:func:`require_secure`).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.aggregation.declared import HELD_FIT, HOLDOUT
from common.aggregation.validate import UpdateRejected
from common.merges.sums import load_running_sums, not_summable
from common.run.config import RunConfig
from common.run.settings import RobustSettings
from common.secagg.primitives import SecAggError
from server.strategies.base import Strategy


def require_secure(config: RunConfig, strategy: Strategy) -> None:
    """``SecAggError`` unless every step of ``strategy``'s first task merges sums only (checked on the
    strategy before its run starts: its aggregators are built, nothing is folded)."""
    if config.section(RobustSettings).enabled:
        raise SecAggError(
            "secure aggregation and the robust mode exclude each other: screening needs each client's update "
            "(docs/RELIABILITY.md weighs the two)"
        )
    strategy.begin_task(0)
    for phase, round_ in strategy.steps(0):
        aggregator = strategy.aggregator(strategy.configure(0, round_, phase))
        part = not_summable(aggregator)
        if part is not None:
            raise SecAggError(
                f"{config.method} cannot run with secure aggregation: its {phase.value} step merges individual "
                f"updates ({type(aggregator).__name__}: {part} keeps more than sums), which the "
                "coordinator would no longer see"
            )


def load_sums(
    aggregator: Aggregator,
    sums: dict[str, Tensor],
    clients: int,
    payload_bytes: int,
    gram_slack: float = 0.0,
    rounding: float = 0.0,
    noised: bool = False,
) -> None:
    """Make ``aggregator`` hold ``sums``, the unmasked sum of ``clients`` clients' terms, then check them
    (``gram_slack``, ``rounding``, ``noised``: see :func:`check_sums`)."""
    load_running_sums(aggregator, sums, clients)
    aggregator.payload_bytes = payload_bytes
    check_sums(aggregator, sums, clients, gram_slack, rounding, noised)


def check_sums(
    aggregator: Aggregator,
    sums: dict[str, Tensor],
    clients: int,
    gram_slack: float = 0.0,
    rounding: float = 0.0,
    noised: bool = False,
) -> None:
    """The coordinator's check of an unmasked sum (it can no longer check one update): every entry
    finite, summed Grams and Fishers and counts non-negative (a Gram's diagonal; a full Gram
    symmetric positive semidefinite up to the fixed point's rounding, ``rounding`` per entry of the sum
    (``FixedPoint.error_bound`` of the clients), and ``gram_slack``, a bound on the spectral norm of the clients'
    distributed noise on it), the sample count at least one per client; the held-out sums against the whole's
    (:func:`check_held_sums`), and, unless the clients ``noised`` their class sums (``dp.mode = distributed``, whose
    noise no Gram bounds), the class sums against their Gram (:func:`check_class_sums`). ``UpdateRejected`` naming
    the sum."""
    for name, t in sums.items():
        if not torch.isfinite(t).all():
            raise UpdateRejected(f"sum {name}", "not finite")
        leaf = name.rsplit("/", 1)[-1]
        gram = leaf in ("total", "projected")
        if gram and t.dim() in (2, 3):  # a Gram, or the (K, d, d) diagonal blocks of one (ridge.blocks)
            for k, block in enumerate(t.reshape(-1, *t.shape[-2:])):
                what = f"sum {name}" + (f" block {k}" if t.dim() == 3 else "")
                scale = float(block.abs().max()) if block.numel() else 0.0
                if not torch.allclose(block, block.T, rtol=0, atol=1e-9 * max(scale, 1.0)):
                    raise UpdateRejected(what, "a summed Gram must be symmetric")
                low = _below_psd(block, scale, gram_slack, rounding)
                if low is not None:
                    raise UpdateRejected(what, f"a summed Gram must be positive semidefinite ({low:.3g})")
        elif (gram and t.dim() == 1) or leaf in ("fisher", "weight") or "count" in leaf:
            if t.numel() and float(t.min()) < 0:
                raise UpdateRejected(f"sum {name}", f"must be non-negative, has {float(t.min()):.3g}")
    if aggregator.num_samples < clients:
        raise UpdateRejected("sum num_samples", f"{aggregator.num_samples} samples from {clients} clients")
    check_held_sums(sums, gram_slack, getattr(aggregator, "rows_per_sample", 1), rounding)
    if not noised:
        check_class_sums(sums, rounding)


def check_class_sums(sums: dict[str, Tensor], rounding: float = 0.0) -> None:
    """Summed class sums ``S`` and counts ``n`` that their summed Gram ``G`` can have come with, for the whole and
    each held-out prefix: a class nobody counted has no sum, and ``sum_c S_c S_c^T / n_c <= G`` on each block in the
    order of positive semidefinite matrices (Cauchy-Schwarz per client, and the sum keeps it: ``(s, n) -> s s^T / n``
    is jointly convex), so that no client turns its sums where the Gram holds nothing (the per-update check,
    ``common/aggregation/features.py:check_sums_fit_gram``); likewise each class's summed second moments (CCVR's)
    at least ``S_c S_c^T / n_c`` (``check_moments_above_means``), so that no covariance comes out negative. Up to
    float64's rounding and the fixed point's (``rounding`` per entry of each sum: on ``M``, the rows ``S_c /
    sqrt(n_c)``, at most ``delta = rounding sqrt(d sum_c 1 / n_c)`` in spectral norm, so ``2 |M| delta + delta^2``
    on ``M^T M``)."""
    for name, t in sums.items():
        root, _, leaf = name.rpartition("plain/")
        if leaf == "class_moment" and f"{root}plain/class_sum" in sums:
            _check_moments(sums, root + "plain/", rounding)
        if not name.endswith("/grams/gram/total") or t.dim() not in (2, 3):
            continue
        root = name[: -len("grams/gram/total")]
        for prefix in ("", HOLDOUT, HELD_FIT):
            g, s = f"{root}grams/{prefix}gram/total", f"{root}plain/{prefix}class_sum"
            if not (g in sums and s in sums and f"{root}plain/{prefix}class_count" in sums) or sums[g].shape != t.shape:
                continue
            means, count = _seen_means(sums, s, rounding)
            blocks = sums[g].reshape(-1, *t.shape[-2:])
            width = blocks.shape[-1]
            delta = rounding * math.sqrt(width * float((1 / count).sum()))
            for k, block in enumerate(blocks):
                low = _below_means(block, means[:, k * width : (k + 1) * width], delta, rounding)
                if low is not None:
                    where = f" block {k}" if t.dim() == 3 else ""
                    raise UpdateRejected(
                        f"sum {s}{where}",
                        f"inconsistent with the summed Gram: sum_c S_c S_c^T / n_c exceeds it ({low:.3g}), which no "
                        "set of features allows",
                    )


def _seen_means(sums: dict[str, Tensor], name: str, rounding: float) -> tuple[Tensor, Tensor]:
    """The rows ``S_c / sqrt(n_c)`` of the classes counted in the class sums ``name``, and their counts;
    ``UpdateRejected`` if a class nobody counted has a sum (beyond the rounding)."""
    class_sum, count = sums[name], sums[name.replace("class_sum", "class_count")]
    seen = count > 0
    if bool((class_sum[~seen].abs() > rounding).any()):
        raise UpdateRejected(f"sum {name}", "a class with no samples must have a zero sum")
    return class_sum[seen] / count[seen].sqrt().unsqueeze(1), count[seen]


def _below_means(gram: Tensor, means: Tensor, delta: float, rounding: float) -> float | None:
    """:func:`_below_psd` of ``gram - means^T means``, ``means``' rounding at most ``delta`` in spectral norm."""
    norm = float(torch.linalg.matrix_norm(means, 2)) if means.numel() else 0.0
    scale = float(gram.abs().max()) if gram.numel() else 0.0
    return _below_psd(gram - means.T @ means, scale, 2 * norm * delta + delta**2, rounding)


def _check_moments(sums: dict[str, Tensor], head: str, rounding: float) -> None:
    """Each counted class's summed second moments at least ``S_c S_c^T / n_c`` (diagonal moments: entry by entry)."""
    moments = sums[head + "class_moment"][sums[head + "class_count"] > 0]
    means, count = _seen_means(sums, head + "class_sum", rounding)
    for c, (moment, mean) in enumerate(zip(moments, means, strict=True)):
        delta = rounding * math.sqrt(mean.numel() / float(count[c]))
        if moment.dim() == 2:
            low = _below_means(moment, mean.unsqueeze(0), delta, rounding)
        else:  # |m_j^2 - mean_j^2| <= 2 |mean_j| delta + delta^2 per entry, the moment's own rounding besides
            floor = 1e-9 * max(float(moment.abs().max()), 1.0) + rounding + 2 * mean.abs() * delta + delta**2
            diff = moment - mean * mean
            low = float(diff.min()) if bool((diff < -floor).any()) else None
        if low is not None:
            raise UpdateRejected(
                f"sum {head}class_moment",
                f"counted class {c}'s summed second moments are below what its sum implies ({low:.3g}): its "
                "covariance would be negative, which no samples give",
            )


def check_held_sums(
    sums: dict[str, Tensor], gram_slack: float = 0.0, rows_per_sample: int = 1, rounding: float = 0.0
) -> None:
    """The held-out samples' sums against the whole's, summed over clients (a held-out rule: ``ridge.holdout``):
    no class holds out more samples than it has, the share views included counts the held-out samples, the summed
    Gram minus the held-out samples' share of it (``heldfit_`` with views, else ``holdout_``), the Gram the lambda
    fit keeps, positive semidefinite on each block, and with views (``rows_per_sample = 1 + V``, the step's
    aggregator's) the clean held-out Gram, which scores lambda, at most ``1 + V`` times the share; up to the
    rounding (the fixed point's, ``rounding`` per entry of each sum) and the clients' noise on both (``gram_slack``
    each). One client's share can no longer be told from the sum: a hostile client's excess is bounded by what the
    others leave, not refused (``docs/RELIABILITY.md``), but the fit's Gram stays a Gram."""
    for name, t in sums.items():
        head, _, leaf = name.rpartition("/")
        if leaf == "class_count" and f"{head}/{HOLDOUT}class_count" in sums:
            held = sums[f"{head}/{HOLDOUT}class_count"]
            if bool((held > t).any()):
                raise UpdateRejected(f"sum {head}/{HOLDOUT}class_count", "a class holds out more than it has")
            counted = sums.get(f"{head}/{HELD_FIT}class_count")
            if counted is not None and not torch.equal(counted, held):
                raise UpdateRejected(f"sum {head}/{HELD_FIT}class_count", "must count the held-out samples")
        if not name.endswith("/gram/total") or t.dim() not in (2, 3):
            continue
        base = name[: -len("gram/total")]
        clean, fit = base + HOLDOUT + "gram/total", base + HELD_FIT + "gram/total"
        share = fit if fit in sums else clean
        if share in sums:
            what = "the held-out samples' summed Gram exceeds the whole's"
            _dominates(sums, name, share, 1, what, gram_slack, rounding)
        if share == fit and clean in sums and rows_per_sample > 1:
            what = f"the held-out samples' summed clean Gram exceeds {rows_per_sample} times their summed share"
            _dominates(sums, fit, clean, rows_per_sample, what, gram_slack, rounding)


def _dominates(
    sums: dict[str, Tensor], big: str, small: str, times: int, what: str, gram_slack: float, rounding: float
) -> None:
    """``UpdateRejected`` naming ``small`` unless ``times`` sums[big] - sums[small] is positive semidefinite on each
    block, up to float64 rounding and, on the two (``times + 1`` of each), each sum's noise slack ``gram_slack`` and
    fixed-point rounding per entry ``rounding``."""
    if sums[small].shape != sums[big].shape:
        return  # a Gram in another form (the average rule's factor rows) is not summed: secure runs refuse it
    whole = times * sums[big].reshape(-1, *sums[big].shape[-2:])
    for k, block in enumerate(whole - sums[small].reshape(whole.shape)):
        scale = float(whole[k].abs().max()) if block.numel() else 0.0
        low = _below_psd(block, scale, (times + 1) * gram_slack, (times + 1) * rounding)
        if low is not None:
            where = f" block {k}" if sums[big].dim() == 3 else ""
            raise UpdateRejected(
                f"sum {small}{where}", f"{what}: the difference must be positive semidefinite ({low:.3g})"
            )


def _below_psd(block: Tensor, scale: float, slack: float, rounding: float = 0.0) -> float | None:
    """The least eigenvalue of the symmetric ``block`` where it is below what a positive semidefinite sum allows:
    ``-(1e-9 max(scale, 1) + rounding) d`` (float64's rounding, ``scale`` the sum's largest entry, and the fixed
    point's, at most ``rounding`` per entry: a symmetric error of entries within ``e`` has spectral norm at most
    ``e d``) less ``slack`` (the clients' noise); ``None`` when it is not. A Cholesky factorization of the block
    shifted by that floor settles an honest sum (a third of the eigenvalues' cost; 0.18 s against 0.61 s at
    d = 2,000 on one thread); only where it fails are the eigenvalues computed, for the verdict and its figure."""
    if not block.numel():
        return None
    floor = (1e-9 * max(scale, 1.0) + rounding) * block.shape[0] + slack
    shifted = block + floor * torch.eye(block.shape[0], dtype=block.dtype, device=block.device)
    if int(torch.linalg.cholesky_ex(shifted).info) == 0:
        return None  # block + floor I positive definite: every eigenvalue of the block above -floor
    low = float(torch.linalg.eigvalsh(block).min())
    return low if low < -floor else None
