"""The project's mechanisms, run on neighbouring data sets under replace-one adjacency with the label kept, many
times, each release reduced to a score for :func:`audit.epsilon_lower_bound`.

The neighbours: ``D`` holds a canary record ``x`` and ``D'`` the record ``x' = -x`` in its place, same class, both
clipped to norm ``C`` (for a Gram, where ``x x^T = x' x'^T``, ``x'`` orthogonal to ``x`` instead); every count the
project releases is the same on both. One record so replaced moves a class sum by ``2 C``, a clipped gradient sum by
``2 C``, a client's clipped change by ``2 S`` and a Gram by ``sqrt(2) C^2``: the most any replacement can.

Each release goes through the project's own code: the client's clip and sums (``client/features.py``), the
coordinator's :class:`~server.strategies.closed_form_dp.PrivateRelease` (its calibration and noise), the clients'
discrete Gaussian shares on the secure aggregation ring (``common/secagg/``), a client's DP-SGD round
(``ClientMethod.train_private``: ``poisson_batches``, ``PerSampleNorms``, ``private_step``), a LoRM client's Gram
release (``GramRecorder``'s energy clip, ``noise_grams``) and the coordinator's client-level
:class:`~server.strategies.private.ClippedChanges`. Where a real call gives one release at a time (a round of DP-SGD,
a Gram release, a client-level mean) the release is measured as what it is, the un-noised output plus a linear image
of the noise source's draws (both read off the real call, which is checked to be exactly that), and its ``N``
releases are drawn at once from the project's seeded normal source.

The score of a release ``y``: the log-likelihood ratio of the Gaussian laws at ``D`` and ``D'`` with the noise the
code states, standardised: ``<m' - m, y - m>_W / mu``, ``W`` the inverse noise variance per entry, ``mu^2 = |m' -
m|_W^2``; ``N(0, 1)`` on ``D`` and ``N(mu, 1)`` on ``D'`` when the noise is as stated, the most powerful test
(Neyman-Pearson). The thresholds are :func:`audit.unit_thresholds`, fixed before any release.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any, cast
from unittest import mock

import numpy as np
import torch
from audit import Bound, epsilon_lower_bound, unit_thresholds
from torch import Tensor, nn

import client.methods.base as client_base
from client.features import feature_map, sums
from client.ledger import ClientLedger
from common.aggregation.base import Aggregator
from common.aggregation.features import StatSums
from common.privacy.gaussian import CLASS_COUNT, CLASS_SUM, GRAM, SeededNoise
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.distributed_dp import noised_entries
from common.secagg.noise import add_noise
from common.secagg.primitives import decode, encode, ring_add
from common.secagg.terms import run_encoding
from common.wire.messages import ClientUpdate, Phase
from common.wire.tensors import DELTA
from server.strategies.closed_form_dp import PrivateRelease
from server.strategies.fold import Fold
from server.strategies.private import ClientLevelPrivacy, ClippedChanges

DELTA_DP = 1e-5  # the stated delta of every audit (the project's default)
CLIP = 1.0  # C, S
FAST_EPSILON = 2.0  # the default suite's stated epsilon: where a factor 2 shows with the fewest releases
SLOW_EPSILON = 8.0  # the slow audits' (and the report's)
LORM_BUDGET = 4.4  # LoRM's budget: each of its two Gram releases a task then states about 2
CHUNK = 250_000  # releases drawn at once (memory: a few (CHUNK, 2, 2) float64 tensors)
CLIENTS = 3  # distributed mode's least federation: three clients, threshold 2


@dataclass(frozen=True)
class Audit:
    """One mechanism's audit: the epsilon the code states for the release audited, and the empirical bound."""

    mechanism: str
    stated: float
    mu: float  # the standardised distance of the two laws the code's noise gives (the bound's ceiling's ratio)
    bound: Bound

    def __str__(self) -> str:
        return f"{self.mechanism}: stated epsilon {self.stated:.3f}, {self.bound}"


def audit_of(mechanism: str, stated: float, mu: float, null: np.ndarray, alt: np.ndarray) -> Audit:
    return Audit(mechanism, stated, mu, epsilon_lower_bound(null, alt, DELTA_DP, unit_thresholds()))


def chunks(samples: int) -> list[int]:
    return [min(CHUNK, samples - start) for start in range(0, samples, CHUNK)]


# ----------------------------------------------------------------------------- the neighbours


def canary(orthogonal: bool = False) -> tuple[Tensor, Tensor]:
    """The raw features ``(1, 2)`` of the canary on ``D`` and of its replacement on ``D'``: norm 3 (beyond the
    clip ``C = 1``, so the client's clip is what bounds them); ``-x``, or with ``orthogonal`` ``x`` turned by 90
    degrees."""
    x = torch.tensor([[1.8, 2.4]], dtype=torch.float64)
    return x, (torch.tensor([[2.4, -1.8]], dtype=torch.float64) if orthogonal else -x)


OTHERS = torch.tensor([[0.3, -0.1], [-0.2, 0.5]], dtype=torch.float64)  # the class's other records (within C)


def client_statistics(raw: Tensor, gram: bool) -> dict[str, Tensor]:
    """What a client sends of its class-0 records ``raw: (n, 2)``: clipped to ``C`` and summed by the client's own
    code (``client/features.py``): ``class_sum (1, 2)``, ``class_count (1,)``, ``gram_factor``."""
    x = feature_map(raw, None, clip=CLIP)
    return sums(x, torch.zeros(len(raw), dtype=torch.int64), (0, 1), gram)


# ----------------------------------------------------------------------------- (a) central: ncm, ridge


def central(method: str, epsilon: float, samples: int, seed: int = 0, orthogonal: bool = False) -> Audit:
    """The coordinator's central release (:class:`PrivateRelease`) of one task's summed statistics, ``samples``
    times a side: the class sums (``ncm``), with the Gram (``ridge``). Each release is one class row and (ridge)
    one Gram, ``samples`` of them at once as the rows of a task of ``samples`` classes and the ``(samples, d, d)``
    diagonal blocks of a Gram, each with its own noise as the coordinator draws it."""
    gram = method == "ridge"
    settings = DpSettings(epsilon=epsilon, delta=DELTA_DP, clip=CLIP, seed=seed)
    x, x_prime = canary(orthogonal)
    sides = [client_statistics(torch.cat([row, OTHERS]), gram) for row in (x, x_prime)]
    names = (CLASS_SUM, CLASS_COUNT, GRAM) if gram else (CLASS_SUM, CLASS_COUNT)
    release = PrivateRelease(settings, {name: () for name in names})
    stated_sigma = {name: r.sigma for name, r in release.releases.items()}
    means = [released_means(side, gram) for side in sides]
    difference = {name: means[1][name] - means[0][name] for name in means[0]}
    mu = math.sqrt(sum(float(d.square().sum()) / stated_sigma[name] ** 2 for name, d in difference.items()))
    scores: list[list[np.ndarray]] = [[], []]
    task = 0
    for side, stats in enumerate(sides):
        for m in chunks(samples):
            released = noised(release, task, stats, m, gram)
            task += 1
            llr = sum(
                ((released[name] - means[0][name]) * d).flatten(1).sum(1) / stated_sigma[name] ** 2
                for name, d in difference.items()
            )
            scores[side].append((cast(Tensor, llr) / mu).numpy())
    stated = release.ledger.epsilon_spent(0)
    return audit_of(f"central {method}", stated, mu, np.concatenate(scores[0]), np.concatenate(scores[1]))


def released_means(stats: dict[str, Tensor], gram: bool) -> dict[str, Tensor]:
    """The un-noised released values of a client's statistics: its class row ``(2,)`` and Gram ``(2, 2)``."""
    out = {CLASS_SUM: stats[CLASS_SUM][0]}
    if gram:
        r = stats[GRAM + "_factor"]
        out[GRAM] = r.T @ r
    return out


def noised(release: PrivateRelease, task: int, stats: dict[str, Tensor], m: int, gram: bool) -> dict[str, Tensor]:
    """``m`` releases of task ``task``: the coordinator's sums of ``m`` copies of the statistics (class rows, Gram
    blocks), noised in place by :meth:`PrivateRelease.release`; ``class_sum (m, 2)``, ``gram (m, 2, 2)``."""
    shapes = {CLASS_SUM: (m, 2), CLASS_COUNT: (m,)} | ({GRAM: (m, 2, 2)} if gram else {})
    total = StatSums(shapes)
    copies = {CLASS_SUM: stats[CLASS_SUM].expand(m, 2), CLASS_COUNT: stats[CLASS_COUNT].expand(m)}
    if gram:
        r = stats[GRAM + "_factor"]
        copies[GRAM + "_factor"] = r.expand(m, *r.shape)
    total.fold(copies)
    release.check(task)
    release.release(task, (0, m), total, survivors=1)
    out = {CLASS_SUM: total.plain[CLASS_SUM], CLASS_COUNT: total.plain[CLASS_COUNT]}
    if gram:
        out[GRAM] = total.grams[GRAM].value()
    return out


def central_counts(samples: int, remove: bool) -> Audit:
    """The class count a central ncm step releases with its noised class sums (public, un-noised), ``samples``
    times a side, scored as it is (its change from ``D``'s): ``D'`` without the canary (``remove``: add/remove
    adjacency) or with ``-x`` in its place (replace-one)."""
    settings = DpSettings(epsilon=FAST_EPSILON, delta=DELTA_DP, clip=CLIP, seed=0)
    x, x_prime = canary()
    sides = [client_statistics(torch.cat([x, OTHERS]), False)]
    sides.append(client_statistics(OTHERS if remove else torch.cat([x_prime, OTHERS]), False))
    release = PrivateRelease(settings, {CLASS_SUM: (), CLASS_COUNT: ()})
    counts = [
        torch.cat([noised(release, 2 * k + side, stats, m, False)[CLASS_COUNT] for k, m in enumerate(chunks(samples))])
        for side, stats in enumerate(sides)
    ]
    base = float(sides[0][CLASS_COUNT][0])
    mu = math.inf if remove else 0.0
    adjacency = "add/remove" if remove else "replace-one"
    null, alt = ((c - base).numpy() for c in counts)
    return audit_of(f"central ncm class_count, {adjacency}", release.ledger.epsilon_spent(0), mu, null, alt)


def update_counts(samples: int, remove: bool) -> Audit:
    """The sample count a DP-SGD client's update carries (``num_samples``, its task's shard: ``step_update``),
    ``samples`` times a side (it is the same every time), scored as its change from ``D``'s: the shard without the
    canary (``remove``) or with ``-x`` in its place. Its stated epsilon: the client's round's."""
    config = dpsgd_config(FAST_EPSILON, 0)
    stated = ClientLedger(config).noise(cast(Any, SimpleNamespace())).epsilon(1, 0, DELTA_DP)
    x, x_prime = canary()
    shards = [torch.cat([x, OTHERS]), OTHERS if remove else torch.cat([x_prime, OTHERS])]
    plan = SimpleNamespace(run_id="audit", task=0, round=0, phase=Phase.TRAIN)
    counts = []
    for shard in shards:
        client = SimpleNamespace(index=0, client_id="audit", shards=[torch.arange(len(shard))])
        update = client_base.step_update(cast(Any, client), cast(Any, plan), {}, float("nan"))
        counts.append(np.full(samples, float(update.num_samples)))
    adjacency = "add/remove" if remove else "replace-one"
    null, alt = (c - counts[0][0] for c in counts)
    return audit_of(f"dp-sgd num_samples, {adjacency}", stated, math.inf if remove else 0.0, null, alt)


# ----------------------------------------------------------------------------- (b) distributed: the shares summed


def distributed(epsilon: float, samples: int, seed: int = 0) -> Audit:
    """The clients' discrete Gaussian shares on the class sums (``dp.mode = distributed``, ncm's statistics), as
    few clients as the project allows (three, threshold two) and as few survivors as a step accepts (two: the sum
    the budget is calibrated for). Client 0 holds the canary, client 1 the class's other records; each encodes its
    class row on the ring's fixed point, adds its share (``DistributedNoise.share``, the exact sampler) and the
    ring sum of the two is decoded, as the coordinator unmasks it (the masks cancel in the sum, so they are left
    out). ``samples`` releases a side at once: the rows of a task of ``samples`` classes, each its own share
    entries."""
    dp = DpSettings(epsilon=epsilon, delta=DELTA_DP, clip=CLIP, seed=seed, mode="distributed")
    fp, noise = run_encoding(SecAggSettings(enabled=True), dp, CLIENTS)
    assert noise is not None
    survivors = noise.threshold
    x, x_prime = canary()
    rows = [[client_statistics(row, False)[CLASS_SUM][0] for row in (x, x_prime)]]
    rows.append([client_statistics(OTHERS, False)[CLASS_SUM][0]] * 2)  # client 1's, on both sides
    probe = noise.layout_releases(noised_entries((), (1, 2)))
    report = noise.report(probe, survivors)
    variance = report["variance"][CLASS_SUM]
    means = [rows[0][side] + rows[1][side] for side in (0, 1)]
    difference = (means[1] - means[0]).numpy()
    mu = float(np.linalg.norm(difference)) / math.sqrt(variance)
    scores: list[list[np.ndarray]] = [[], []]
    for side in (0, 1):
        for k, m in enumerate(chunks(samples)):
            entries = noised_entries((), (m, 2))
            terms = []
            for client in range(survivors):
                encoded = encode(rows[client][side].expand(m, 2).numpy(), fp)
                share = noise.share(entries, (0, m), b"audit/%d/%d" % (side, k), client)
                terms.append(add_noise(encoded, share, noise.share_tail))
            total = functools.reduce(ring_add, terms)
            released = decode(total, fp, survivors).reshape(m, 2)
            scores[side].append((released - means[0].numpy()) @ difference / variance / mu)
    return audit_of("distributed ncm", report["epsilon"], mu, np.concatenate(scores[0]), np.concatenate(scores[1]))


# ----------------------------------------------------------------------------- affine releases, measured


class Zeros:
    """A noise source of zeros: the release un-noised."""

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        return torch.zeros(shape, dtype=torch.float64)


class Recorded:
    """The project's seeded normal source, remembering what it drew."""

    def __init__(self, seed: int) -> None:
        self.inner, self.draws = SeededNoise(seed), cast(list[Tensor], [])

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        draw = self.inner.normal(shape)
        self.draws.append(draw.clone())
        return draw


class Basis:
    """A noise source whose draws, in the order asked, are all 0 but the ``index``-th, 1: one column of the linear
    map from a release's draws to its noise."""

    def __init__(self, index: int) -> None:
        self.index, self.drawn = index, 0

    def normal(self, shape: tuple[int, ...]) -> Tensor:
        out = torch.zeros(math.prod(shape), dtype=torch.float64)
        if 0 <= self.index - self.drawn < out.numel():
            out[self.index - self.drawn] = 1.0
        self.drawn += out.numel()
        return out.view(shape)


def measured(release: Callable[[Any], Tensor], seed: int) -> tuple[Tensor, Tensor]:
    """``(m, A)`` with ``release(source) = m + A Z`` for the ``p`` standard normal draws ``Z`` the release asks of
    its source, ``m: (k,)`` and ``A: (k, p)``: ``m`` the release with a source of zeros, each column of ``A`` with
    a source of one 1 (:class:`Basis`); ``AssertionError`` unless a seeded source's release is exactly that (the
    release is affine in its draws, as a Gaussian mechanism's is)."""
    mean = release(Zeros()).flatten()
    source = Recorded(seed)
    noisy = release(source).flatten()
    draws = torch.cat([d.flatten() for d in source.draws])
    columns = torch.stack([release(Basis(j)).flatten() - mean for j in range(draws.numel())], 1)
    residual = float((noisy - mean - columns @ draws).abs().max())
    assert residual <= 1e-12 * float(columns.abs().max()), f"the release is not affine in its draws ({residual:g})"
    return mean, columns


def affine(
    mechanism: str, stated: float, release: Callable[[Tensor, Any], Tensor], sides: tuple[Tensor, Tensor], samples: int
) -> Audit:
    """An audit of a release that is its un-noised value plus a linear image of standard normal draws
    (:func:`measured` on each side: the maps must agree), ``samples`` releases a side drawn at once from the
    project's seeded source. The score: the log-likelihood ratio under the noise's covariance ``A A^T`` (its
    pseudo-inverse: a full Gram's mirrored entries are one coordinate)."""
    (m0, a0), (m1, a1) = (measured(functools.partial(release, d), seed=1) for d in sides)
    assert torch.allclose(a0, a1, rtol=1e-12, atol=0.0), "the noise differs between D and D'"
    difference = m1 - m0
    covariance = a0 @ a0.T
    weights = torch.linalg.pinv(covariance, hermitian=True) @ difference
    assert torch.allclose(covariance @ weights, difference, atol=1e-9 * float(difference.abs().max())), (
        "D and D' differ where no noise covers the release: a perfect distinguisher"
    )
    mu = math.sqrt(float(difference @ weights))
    scores: list[list[np.ndarray]] = [[], []]
    for side, mean in enumerate((m0, m1)):
        source = SeededNoise(100 + side)
        for m in chunks(samples):
            released = mean + source.normal((m, a0.shape[1])) @ a0.T
            scores[side].append(((released - m0) @ weights / mu).numpy())
    return audit_of(mechanism, stated, mu, np.concatenate(scores[0]), np.concatenate(scores[1]))


# ----------------------------------------------------------------------------- (c) DP-SGD


class TinyModel(nn.Module):
    """A linear classifier of 2 features into 2 classes, no bias, from zero weights: the client's model as
    ``ClientMethod`` calls it (``model(inputs) -> (logits, features)``)."""

    def __init__(self) -> None:
        super().__init__()
        self.head = nn.Linear(2, 2, bias=False, dtype=torch.float64)
        nn.init.zeros_(self.head.weight)

    def forward(self, inputs: dict[str, Tensor]) -> tuple[Tensor, Tensor]:
        return self.head(inputs["x"]), inputs["x"]


class Rows:
    """A client's training samples: feature rows and labels (``client.worker.SampleData``'s ``batch``)."""

    def __init__(self, x: Tensor, labels: Tensor) -> None:
        self.x, self.labels = x, labels

    def batch(self, idx: Tensor, device: torch.device, **_: Any) -> tuple[dict[str, Tensor], Tensor]:
        return {"x": self.x[idx]}, self.labels[idx]


def dpsgd_config(epsilon: float, seed: int) -> RunConfig:
    """A run of one task, one round of one epoch, at sampling rate 1: one DP-SGD step on the whole shard."""
    settings = {"dp": {"epsilon": epsilon, "delta": DELTA_DP, "mode": "local", "sample_rate": 1.0, "seed": seed}}
    return RunConfig(method="fedavg-lora", settings=settings, local_epochs=1, rounds_per_task=1)


def dpsgd_round(config: RunConfig, canary_row: Tensor, source: Any) -> Tensor:
    """The gradient a client's DP-SGD round releases (``ClientMethod.train_private``, its noise source replaced by
    ``source``), ``(2, 2)``: the model's change by plain SGD at rate 1 from zero weights. The shard: the canary, of
    class 0 (its gradient's norm 2.1 at zero weights, clipped to ``C``), and the class's other records."""
    model = TinyModel()
    x = torch.cat([canary_row, OTHERS])
    shard = torch.arange(len(x))
    client = SimpleNamespace(
        config=config,
        index=0,
        client_id="audit",
        model=model,
        device=torch.device("cpu"),
        shards=[shard],
        ledger=ClientLedger(config),
        train=Rows(x, torch.zeros(len(x), dtype=torch.int64)),
        on_batch=None,
    )
    plan = SimpleNamespace(task=0, round=0, class_range=(0, 2))
    head = list(model.head.parameters())
    optimizer = torch.optim.SGD(head, lr=1.0)
    with mock.patch.object(client_base, "gradient_noise", lambda *args, **kwargs: source):
        client_base.ClientMethod().train_private(
            cast(Any, client), cast(Any, plan), shard, [], head, optimizer, torch.Generator().manual_seed(0)
        )
    return -model.head.weight.detach().double()


def dpsgd(epsilon: float, samples: int, seed: int = 0) -> Audit:
    """A client's DP-SGD round of one step on a tiny linear model (the canary ``x`` or ``-x`` in its shard), as
    the project calibrates it (``training_noise`` through the client's ledger) and states it (the round's epsilon,
    ``TrainingNoise.epsilon``)."""
    config = dpsgd_config(epsilon, seed)
    noise = ClientLedger(config).noise(cast(Any, SimpleNamespace()))
    stated = noise.epsilon(1, 0, DELTA_DP)
    x, x_prime = canary()
    return affine(
        "dp-sgd (one step)", stated, lambda row, source: dpsgd_round(config, row, source), (x, x_prime), samples
    )


def lorm_config(epsilon: float, seed: int) -> RunConfig:
    """LoRM with a budget, one round a task, half of it to the Grams: each of its two Gram releases (the round's
    and the task Gram step's) then states about epsilon 2 at a budget of 4.4."""
    dp = {"epsilon": epsilon, "delta": DELTA_DP, "mode": "local", "sample_rate": 1.0, "gram_share": 0.5, "seed": seed}
    return RunConfig(method="lorm", settings={"dp": dp}, local_epochs=1, rounds_per_task=1)


def lorm_gram(config: RunConfig, canary_row: Tensor, source: Any) -> Tensor:
    """The head's full Gram a LoRM client releases (``client/methods/lora.py``'s ``noise_grams``, its noise source
    replaced by ``source``): the model's head input recorded with the energy clip ``dp.gram_clip``
    (``GramRecorder``), noised, ``lambda I`` added; ``(2, 2)``. The shard: the canary and the class's other
    records (within the clip)."""
    from client.methods.lora import noise_grams
    from common.adapters.lora import GramRecorder

    model = TinyModel()
    recorder = GramRecorder({"<head>": model.head}, full=True, energy_clip=config.section(DpSettings).gram_clip)
    with torch.no_grad(), recorder.recording():
        model({"x": torch.cat([canary_row, OTHERS])})
    grams = recorder.result()
    client = SimpleNamespace(config=config, index=0, ledger=ClientLedger(config))
    plan = SimpleNamespace(task=0, round=0, phase=Phase.TASK_GRAM)
    with mock.patch("client.methods.lora.gradient_noise", lambda *args, **kwargs: source):
        noise_grams(cast(Any, client), cast(Any, plan), grams)
    return grams["<head>"]


def lorm_grams(epsilon: float, samples: int, seed: int = 0) -> Audit:
    """One of LoRM's Gram releases (local mode) of the head's input: the canary ``x`` replaced by an orthogonal
    ``x'`` of the same energy moves the Gram by ``sqrt(2) c``, the most two positive semi-definite parts of norm
    ``c`` can differ. Its stated epsilon: one Gram release's (``TrainingNoise.epsilon(0, 1, delta)``)."""
    config = lorm_config(epsilon, seed)
    stated = ClientLedger(config).noise(cast(Any, SimpleNamespace())).epsilon(0, 1, DELTA_DP)
    x, x_prime = canary(orthogonal=True)
    return affine("lorm gram (one release)", stated, functools.partial(lorm_gram, config), (x, x_prime), samples)


# ----------------------------------------------------------------------------- (d) client level


class Merged(Aggregator):
    """The method's aggregator as :class:`ClippedChanges` folds its noised mean into it: here it keeps it."""

    def _fold(self, update: ClientUpdate) -> None:
        self.tensors = update.tensors


def client_update(index: int, change: Tensor) -> ClientUpdate:
    return ClientUpdate("audit", f"client-{index}", index, 0, 0, Phase.TRAIN, 10, {f"{DELTA}/w": change.float()})


def client_level_config(epsilon: float, seed: int) -> RunConfig:
    settings = {"dp": {"epsilon": epsilon, "delta": DELTA_DP, "mode": "client", "clip": CLIP, "seed": seed}}
    return RunConfig(method="fedavg", settings=settings, num_tasks=1, rounds_per_task=1)


def client_level_round(config: RunConfig, change: Tensor, source: Any) -> Tensor:
    """The coordinator's client-level mean of a round (``ClientLevelPrivacy``'s ``ClippedChanges``, its noise
    ``source``) of two clients' dense changes ``(2,)``: client 0's ``change`` (norm 3, clipped to ``S``) and client
    1's fixed one."""
    privacy = ClientLevelPrivacy(config)
    plan = SimpleNamespace(tensors={}, class_range=(0, 0), task=0, round=0, phase=Phase.TRAIN)
    inner = Merged(cast(Any, plan), {})
    clipped = privacy.wrap(Fold(cast(Any, plan), inner, lambda plan, merged: None)).aggregator
    for index, update in enumerate((change[0], OTHERS[0])):
        clipped.fold(client_update(index, update), checked=True)
    assert isinstance(clipped, ClippedChanges), f"client-level mode folds into ClippedChanges, not {clipped!r}"
    clipped.finish(source)  # the noised mean into the method's aggregator, with the audit's noise
    return inner.tensors[f"{DELTA}/w"].double()


def client_level(epsilon: float, samples: int, seed: int = 0) -> Audit:
    """Client-level DP (DP-FedAvg) over one round of a one-round run (the budget's ``R = 1``): client 0's whole
    change replaced by its negation (one client's data set replaced by another), its epsilon as the coordinator
    states it after the round."""
    config = client_level_config(epsilon, seed)
    privacy = ClientLevelPrivacy(config)
    stated = privacy.noise.epsilon(1, DELTA_DP)
    x, x_prime = canary()
    return affine(
        "client level (one round)",
        stated,
        lambda c, source: client_level_round(config, c, source),
        (x, x_prime),
        samples,
    )


MECHANISMS: dict[str, Callable[[float, int], Audit]] = {
    "central ncm": lambda eps, n: central("ncm", eps, n),
    "central ridge": lambda eps, n: central("ridge", eps, n),
    "central ridge, Gram": lambda eps, n: central("ridge", eps, n, orthogonal=True),
    "distributed ncm": lambda eps, n: distributed(eps, n),
    "dp-sgd": lambda eps, n: dpsgd(eps, n),
    "client level": lambda eps, n: client_level(eps, n),
    "lorm grams": lambda eps, n: lorm_grams(eps, n),
    "class count, add/remove": lambda eps, n: central_counts(n, remove=True),
}
