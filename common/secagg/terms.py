"""Secure aggregation's encoding of a step's terms, shared by the client and the coordinator.

The fixed point of a run (:func:`fixed_point`), the threshold (:func:`threshold`), what binds a
step's masks to it (:func:`context`), a client's terms (:func:`client_terms`: its update folded
into a fresh aggregator of the step, as running sums), square Grams packed to their lower triangle
(:func:`pack`), the flat order of a step's sums (:class:`Layout`), and the masked update a client
pushes (:func:`masked_update`). The rounds are in ``common/secagg/rounds.py``; the coordinator's
side in ``server/secure.py``.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor

from common.merges.sums import running_sums
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.distributed_dp import DistributedNoise
from common.secagg.graph import SPARSE_FROM, Graph, Parameters, derive
from common.secagg.noise import add_noise
from common.secagg.primitives import FixedPoint, SecAggError, encode
from common.secagg.rounds import default_threshold
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import MASKED

DTYPE = torch.float64


def fixed_point(settings: SecAggSettings, clients: int) -> FixedPoint:
    """The encoding of a run of ``clients``: ``settings.bound``, and ``frac_bits`` or the most that
    ``clients x bound x 2^f < 2^126`` allows, capped at 64 (the decoded sum's error is at most
    ``clients x 2^-(f+1)`` per entry: below float64's rounding of any value over ``2^-11``)."""
    f = settings.frac_bits or min(64, math.floor(126 - math.log2(clients * settings.bound) - 1e-9))
    fp = FixedPoint(frac_bits=f, bound=settings.bound)
    fp.check(clients)
    return fp


def run_encoding(settings: SecAggSettings, dp: DpSettings, clients: int) -> tuple[FixedPoint, DistributedNoise | None]:
    """The run's fixed point, and with ``dp.mode = distributed`` its clients' noise, whose fixed point it is
    (``common/secagg/distributed_dp.py``: fewer fractional bits, the bound widened by a share's tail)."""
    if not dp.distributed:
        return fixed_point(settings, clients), None
    noise = DistributedNoise(dp, settings, clients, threshold(settings, clients))
    return noise.fp, noise


def sparse_parameters(settings: SecAggSettings, clients: int) -> Parameters | None:
    """The sparse graph's sizes of a run of ``clients`` (``common/secagg/graph.py``), or ``None`` for the complete
    graph: ``secagg.graph = complete``, ``auto`` below :data:`SPARSE_FROM` clients, or a derived ``k`` that is
    every other client anyway."""
    if settings.graph == "complete" or (settings.graph == "auto" and clients < SPARSE_FROM):
        return None
    params = derive(clients, settings.dropout, settings.corrupt, settings.failure_bits)
    if params.complete:
        return None
    if settings.threshold and settings.threshold != params.t:  # the derived one written out is the same run
        raise SecAggError(
            f"secagg.threshold {settings.threshold} with the sparse graph of {clients} clients: its threshold is "
            f"derived per neighbourhood ({params.t} of {params.k + 1}); leave secagg.threshold at 0"
        )
    return params


def threshold(settings: SecAggSettings, clients: int) -> int:
    """The run's threshold: on the sparse graph its neighbourhoods' (:func:`sparse_parameters`); else
    ``secagg.threshold``, or a majority (``secagg.mode = signed``: ``2n/3 + 1``, which that mode also requires as
    its least)."""
    params = sparse_parameters(settings, clients)
    if params is not None:
        return params.t
    signed = settings.mode == "signed"
    t = settings.threshold or default_threshold(clients, signed)
    if not 1 <= t <= clients:
        raise SecAggError(f"secagg.threshold {t} for {clients} clients: it must lie in [1, {clients}]")
    if signed and 3 * t <= 2 * clients:
        raise SecAggError(
            f"secagg.threshold {t} for {clients} clients in the signed mode: it needs more than two thirds, at least "
            f"{default_threshold(clients, True)} (a deviating coordinator splitting its requests needs 2t - n "
            "colluders)"
        )
    return t


def step_graph(settings: SecAggSettings, clients: int, ctx: bytes) -> Graph:
    """The graph of the step whose context is ``ctx``: sparse (drawn from the context: every party computes the
    same) or complete, with the run's threshold."""
    params = sparse_parameters(settings, clients)
    if params is None:
        return Graph.full(clients, threshold(settings, clients))
    return Graph.sparse(params, ctx)


def context(plan: RoundPlan) -> bytes:
    """What binds a step's keys and masks to it: run, task, round, phase, and the step's secure session
    after a restart (``plan.secure_attempt``; the first session's context names none)."""
    attempt = f"|attempt {plan.secure_attempt}" if plan.secure_attempt else ""
    return f"{plan.run_id}|{plan.task}|{plan.round}|{plan.phase.value}{attempt}".encode()


TRIL = "@tril"  # a summed Gram sent as its lower triangle (row by row), the only half the solves read


def pack(sums: dict[str, Tensor]) -> dict[str, Tensor]:
    """``sums`` with every square summed Gram (a ``GramSum``'s ``total``; a ``BlockGramSum``'s ``(K, d, d)``:
    each block) as its lower triangle, under ``name@tril``: half the bytes, and exactly what Cholesky and
    ``eigh`` read of the plain sum."""
    out = {}
    for name, t in sums.items():
        if name.endswith("/total") and t.dim() in (2, 3) and t.shape[-2] == t.shape[-1]:
            rows, cols = torch.tril_indices(t.shape[-1], t.shape[-1])
            out[name + TRIL] = t[..., rows, cols]  # (d(d+1)/2,) or (K, d(d+1)/2)
        else:
            out[name] = t
    return out


def unpack(sums: dict[str, Tensor]) -> dict[str, Tensor]:
    """Inverse of :func:`pack`: each lower triangle (or each block's, ``(K, d(d+1)/2)``) back to its symmetric
    matrix."""
    out = {}
    for name, t in sums.items():
        if not name.endswith(TRIL):
            out[name] = t
            continue
        entries = t.shape[-1] if t.dim() else 0
        d = int(round((math.sqrt(8 * entries + 1) - 1) / 2))
        if t.dim() not in (1, 2) or d * (d + 1) // 2 != entries:
            raise SecAggError(f"{name}: shape {tuple(t.shape)} is no lower triangle, nor a stack of them")
        rows, cols = torch.tril_indices(d, d)
        full = torch.zeros(*t.shape[:-1], d, d, dtype=t.dtype)
        full[..., rows, cols] = t
        full[..., cols, rows] = t
        out[name.removesuffix(TRIL)] = full
    return out


@dataclass(frozen=True)
class Layout:
    """The names and shapes of a step's running sums, in the order they are flattened."""

    entries: tuple[tuple[str, tuple[int, ...]], ...]

    @staticmethod
    def of(sums: dict[str, Tensor]) -> Layout:
        return Layout(tuple((name, tuple(t.shape)) for name, t in sorted(sums.items())))

    @property
    def size(self) -> int:
        return sum(math.prod(shape) for _, shape in self.entries)

    def flatten(self, sums: dict[str, Tensor]) -> np.ndarray:
        if Layout.of(sums) != self:
            raise SecAggError("the terms do not have the step's layout of sums")
        return np.concatenate([sums[name].detach().to(DTYPE).reshape(-1).numpy() for name, _ in self.entries])

    @staticmethod
    def of_masked(masked: dict[str, Tensor]) -> Layout:
        """The layout of masked sums: each a tensor of the sum's shape plus a last axis of the two limbs."""
        if any(t.dim() == 0 or t.shape[-1] != 2 for t in masked.values()):
            raise SecAggError("a masked sum carries two 64-bit limbs per entry (a last axis of 2)")
        return Layout(tuple((name, tuple(t.shape[:-1])) for name, t in sorted(masked.items())))

    def flatten_ring(self, masked: dict[str, Tensor]) -> np.ndarray:
        """Masked int64 tensors by sum name -> one ring vector (``(size, 2)`` uint64 limbs), in the layout's order."""
        if Layout.of_masked(masked) != self:
            raise SecAggError("the masked sums do not have the step's layout")
        return np.concatenate([masked[name].reshape(-1, 2).numpy().view(np.uint64) for name, _ in self.entries])

    def unflatten_ring(self, ring: np.ndarray) -> dict[str, Tensor]:
        """Inverse of :meth:`flatten_ring`: int64 tensors holding the ring elements' limbs."""
        out, at = {}, 0
        for name, shape in self.entries:
            n = math.prod(shape)
            limbs = np.ascontiguousarray(ring[at : at + n]).view(np.int64)
            out[name] = torch.from_numpy(limbs).reshape(*shape, 2)
            at += n
        return out

    def unflatten(self, flat: np.ndarray) -> dict[str, Tensor]:
        out, at = {}, 0
        for name, shape in self.entries:
            n = math.prod(shape)
            out[name] = torch.from_numpy(np.ascontiguousarray(flat[at : at + n])).reshape(shape).to(DTYPE)
            at += n
        return out


def client_terms(aggregator: Any, update: ClientUpdate) -> dict[str, Tensor]:
    """What a client masks: its update folded into a fresh aggregator of the step, as running sums.

    The client checks its own update first (``UpdateRejected``), as the coordinator would have:
    the coordinator sees only the sum."""
    if aggregator.count:
        raise ValueError("client_terms needs a fresh aggregator of the step")
    aggregator.fold(update)  # checked first, as the coordinator checks
    return running_sums(aggregator)


def declared_layout(fresh: Any) -> Layout:
    """The layout of a step's masked sums from its declaration alone (``fresh``: a fresh aggregator of the
    step): an all-zero update of the declared shapes folded unchecked, whose running sums' names and shapes
    are every client's (they depend on the plan, not on the values). The coordinator holds each masked
    input to it, so that no client's input decides the step's layout."""
    if fresh.count:
        raise ValueError("declared_layout needs a fresh aggregator of the step")
    plan = fresh.plan
    zeros = {name: torch.zeros(shape, dtype=DTYPE) for name, shape in fresh.expected().items()}
    probe = ClientUpdate.of_step(plan, 0, "", 1, zeros)
    fresh.fold(probe, checked=True)  # only the shapes are read
    return Layout.of(pack(running_sums(fresh)))


def encode_terms(
    terms: dict[str, Tensor],
    fp: FixedPoint,
    session: ClientSession,
    noise: DistributedNoise | None = None,
    rows: tuple[int, int] = (0, 0),
) -> np.ndarray:
    """A client's packed ``terms`` on the ring, in their layout's order: encoded, and with distributed noise
    (``noise``) its share added before any mask (the task's class-sum ``rows``; keyed by ``session``'s context and
    index when ``dp.seed`` is set). A share beyond its tail bound: ``SecAggError``, the client sits the step out."""
    layout = Layout.of(terms)
    encoded = encode(layout.flatten(terms), fp)
    if noise is None:
        return encoded
    share = noise.share(layout.entries, rows, session.context, session.index)
    return add_noise(encoded, share, noise.share_tail)


def masked_update(
    update: ClientUpdate,
    terms: dict[str, Tensor],
    session: ClientSession,
    sharers: list[int],
    fp: FixedPoint,
    attempt: int = 0,
    noise: DistributedNoise | None = None,
    rows: tuple[int, int] = (0, 0),
) -> ClientUpdate:
    """What a client pushes in a secure step: ``update``'s scalar fields without its sample count or
    loss (they are sums too), and its terms encoded, noised (:func:`encode_terms`) and masked, as
    ``masked/<sum>`` int64 tensors, naming the step's session it was masked for (``attempt``: the plan's
    ``secure_attempt``)."""
    terms = pack(terms)
    layout = Layout.of(terms)
    ring = session.mask(encode_terms(terms, fp, session, noise, rows), sharers)
    tensors = {f"{MASKED}/{name}": t for name, t in layout.unflatten_ring(ring).items()}
    return dataclasses.replace(update, num_samples=0, train_loss=float("nan"), tensors=tensors, secure_attempt=attempt)
