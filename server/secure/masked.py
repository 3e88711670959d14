"""A secure step's masked inputs against the step's declared layout: their form, their sum, its unmasking.

The layout (:class:`~common.secagg.terms.Layout`) comes from the step's declaration, never from a client's
input, so no first pusher decides it: a masked push's headers are held to it before any byte is read
(:func:`check_declared`), a masked input's tensors when it is staged (:func:`check_tensors`). The survivors'
inputs, read back from staging one at a time, are added into the session (:func:`close_inputs`), and the
session's result is decoded from the fixed point into the step's sums of terms (:func:`unmasked`). The step's
state machine (:mod:`server.secure.step`) decides when each happens.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import Tensor

from common.aggregation.validate import UpdateRejected
from common.secagg.primitives import FixedPoint, decode
from common.secagg.server_session import ServerSession
from common.secagg.terms import Layout, unpack
from common.wire.messages import ClientUpdate
from common.wire.tensors import MASKED


def check_declared(layout: Layout, declared: dict[str, tuple[str, tuple[int, ...]]], declared_bytes: int) -> None:
    """A masked push's headers (name -> (dtype, shape)) against the step's layout, before any byte is
    read: ``UpdateRejected`` unless they name exactly its masked sums, int64 limb pairs, of its size."""
    int64 = all(dtype == "int64" for dtype, _ in declared.values())
    _check_sums(layout, {name: tuple(shape) for name, (_, shape) in declared.items()}, int64)
    if declared_bytes != 16 * layout.size:
        raise UpdateRejected(
            "masked", f"declares {declared_bytes} bytes, the step's masked sums are {16 * layout.size}"
        )


def check_tensors(layout: Layout, tensors: dict[str, Tensor]) -> None:
    """A masked input, as its update's named tensors: ``UpdateRejected`` unless it carries masked sums only,
    int64 limb pairs, in the step's layout (what :func:`check_declared` holds a push's headers to)."""
    int64 = all(t.dtype == torch.int64 for t in tensors.values())
    _check_sums(layout, {name: tuple(t.shape) for name, t in tensors.items()}, int64)


def _check_sums(layout: Layout, shapes: dict[str, tuple[int, ...]], int64: bool) -> None:
    """``shapes`` (wire name -> shape) must be exactly the step's masked sums, each entry a pair of int64
    limbs: the layout comes from the step's declaration, so no first pusher decides it."""
    want = {f"{MASKED}/{name}": (*shape, 2) for name, shape in layout.entries}
    if shapes != want:
        missing, extra = sorted(set(want) - set(shapes)), sorted(set(shapes) - set(want))
        wrong = sorted(n for n in set(shapes) & set(want) if shapes[n] != want[n])
        raise UpdateRejected(
            "masked",
            f"a secure step's update carries the step's masked sums, as declared: missing {missing[:5]}, "
            f"unexpected {extra[:5]}, of another shape {wrong[:5]}",
        )
    if not int64:
        raise UpdateRejected("masked", "masked sums travel as int64 (the limbs of Z_2^128)")


def add_input(session: ServerSession, layout: Layout, update: ClientUpdate) -> None:
    vector = layout.flatten_ring(update.named(MASKED))
    session.masked_input(update.client_index, vector)


def close_inputs(session: ServerSession, layout: Layout, inputs: Iterable[ClientUpdate]) -> None:
    """Add the masked ``inputs`` (the survivors', from staging, one at a time) and fix ``U3``."""
    for update in inputs:
        add_input(session, layout, update)
    session.close_inputs()


def unmasked(session: ServerSession, layout: Layout, fp: FixedPoint) -> tuple[dict[str, Tensor], int]:
    """The survivors' sum of terms (decoded) and how many survivors; ``Culprits`` or ``SecAggError``
    when the sum cannot be unmasked (a wrong share, a sum outside the fixed point's range)."""
    survivors, _ = session.close_inputs()
    total = decode(session.result(), fp, len(survivors))
    return unpack(layout.unflatten(total)), len(survivors)
