"""Secure aggregation of a step (issue 19): clients' merge terms masked, only their sum unmasked.

A step's aggregator keeps running sums of per-client terms (``common/sums.py``). With secure
aggregation on, each client folds its own update into a fresh aggregator of the same step (the
coordinator's code, so a client masks exactly what the coordinator would have folded) after
checking it as the coordinator would, reads the running sums, encodes them in fixed point
(:func:`fixed_point`) and masks them (``common/secagg_rounds.py``). The coordinator adds the
masked vectors, unmasks the sum of the survivors and loads it into its aggregator
(:func:`load_sums`), then checks the sum (:func:`check_sums`): the merge runs unchanged.

What changes for the method: a Gram travels full (a sum of QR factors is no factor of the sum),
and the per-class sums of a features step span every class. Methods whose merge needs an
individual update (TIES' sign election, PILoRA's per-client prototypes, the robust mode's
screening) refuse (:func:`require_secure`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

import torch
from torch import Tensor

from common.config import RunConfig
from common.messages import ClientUpdate, RoundPlan
from common.secagg import SecAggError, decode, encode
from common.secagg_rounds import ClientSession, ServerSession, session_from_state, session_state
from common.secure_terms import Layout, client_terms, context, fixed_point, pack, threshold, unpack
from common.settings import RobustSettings, SecAggSettings
from common.sums import load_running_sums, not_summable
from common.tensors import MASKED
from server.strategies.base import Aggregator, Strategy
from server.strategies.validate import UpdateRejected

DTYPE = torch.float64


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
                f"{config.strategy} cannot run with secure aggregation: its {phase.value} step merges individual "
                f"updates ({type(aggregator).__name__}: {part} keeps more than sums), which the "
                "coordinator would no longer see"
            )


def load_sums(aggregator: Aggregator, sums: dict[str, Tensor], clients: int, payload_bytes: int) -> None:
    """Make ``aggregator`` hold ``sums``, the unmasked sum of ``clients`` clients' terms, then check them."""
    load_running_sums(aggregator, sums, clients)
    aggregator.payload_bytes = payload_bytes
    check_sums(aggregator, sums, clients)


def check_sums(aggregator: Aggregator, sums: dict[str, Tensor], clients: int) -> None:
    """The coordinator's check of an unmasked sum (it can no longer check one update): every entry
    finite, summed Grams and Fishers and counts non-negative (a Gram's diagonal; a full Gram
    symmetric positive semidefinite up to the fixed point's rounding), the sample count at least one
    per client. ``UpdateRejected`` naming the sum."""
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
                low = float(torch.linalg.eigvalsh(block).min()) if block.numel() else 0.0
                if low < -1e-9 * max(scale, 1.0) * block.shape[0]:
                    raise UpdateRejected(what, f"a summed Gram must be positive semidefinite ({low:.3g})")
        elif (gram and t.dim() == 1) or leaf in ("fisher", "weight") or "count" in leaf:
            if t.numel() and float(t.min()) < 0:
                raise UpdateRejected(f"sum {name}", f"must be non-negative, has {float(t.min()):.3g}")
    if aggregator.num_samples < clients:
        raise UpdateRejected("sum num_samples", f"{aggregator.num_samples} samples from {clients} clients")


@dataclass
class Timings:
    """Seconds each party spent in :func:`secure_step`: each client computing its terms, sharing,
    masking and answering; the coordinator adding the masked inputs and unmasking (bench/secagg_cost.py)."""

    client: dict[int, float] = field(default_factory=dict)
    server: float = 0.0

    @contextlib.contextmanager
    def of(self, party: int | None) -> Iterator[None]:
        """Time the block for client ``party`` (``None``: the coordinator)."""
        start = time.perf_counter()
        try:
            yield
        finally:
            seconds = time.perf_counter() - start
            if party is None:
                self.server += seconds
            else:
                self.client[party] = self.client.get(party, 0.0) + seconds


def secure_step(
    aggregator: Aggregator,
    as_client: Strategy,
    updates: dict[int, ClientUpdate],
    settings: SecAggSettings,
    clients: int,
    drop_after_sharing: tuple[int, ...] = (),
    timings: Timings | None = None,
) -> ServerSession:
    """One step's secure aggregation among in-process clients: every round of the protocol, with the
    clients ``drop_after_sharing`` vanishing after the share round (their masks are removed from the
    sum). ``as_client``: the method as a client builds it from the run's configuration (no state),
    whose ``aggregator(plan)`` is the fresh aggregator a client folds its update into.
    Loads the survivors' sum into ``aggregator``; returns the coordinator's session (what it held).
    ``timings``: the parties' seconds are added to it."""
    clock = timings or Timings()
    plan = aggregator.plan
    t, fp, ctx = threshold(settings, clients), fixed_point(settings, clients), context(plan)
    terms, sessions = {}, {}
    for i, u in sorted(updates.items()):
        with clock.of(i):
            terms[i] = pack(client_terms(as_client.aggregator(plan), u))
            sessions[i] = ClientSession(i, t, ctx)
    layout = Layout.of(next(iter(terms.values())))
    server = ServerSession(expected=list(range(clients)), threshold=t, context=ctx, size=layout.size)
    for s in sessions.values():
        server.advertise(s.advertise())
    roster = server.close_keys()
    for i, s in sessions.items():
        with clock.of(i):
            boxes = s.share(roster)
        server.share(i, boxes)
    sharers = server.close_shares()
    for i, s in sessions.items():
        if i not in drop_after_sharing:
            with clock.of(i):
                y = s.mask(encode(layout.flatten(terms[i]), fp), sharers)
            with clock.of(None):
                server.masked_input(i, y)
    survivors, dropped = server.close_inputs()
    for i in survivors:
        inbox = server.inbox(i)
        with clock.of(i):
            answer = sessions[i].reveal(inbox, survivors, dropped)
        server.reveal(i, answer)
    with clock.of(None):
        total = decode(server.result(), fp, len(survivors))
        payload = 16 * layout.size * len(survivors)
        load_sums(aggregator, unpack(layout.unflatten(total)), len(survivors), payload)
    return server


def added_counts(a: dict[str, int], b: dict[str, int]) -> dict[str, int]:
    """Bytes per round of ``a`` and ``b`` together."""
    return {k: a.get(k, 0) + b.get(k, 0) for k in a | b}


def secagg_report(
    session: ServerSession,
    clients: int,
    aggregator: Aggregator,
    attempt: int = 0,
    earlier: dict | None = None,
    failures: list[str] | None = None,
    excluded: dict[int, str] | None = None,
) -> dict:
    """What a secure step's history entry records: who finished, the samples their unmasked sum
    counts, the bytes each round brought in (``earlier``: those of the step's abandoned sessions,
    added), and which session finished (``attempt``: 0 unless the step was restarted). After a
    restart also why each earlier session failed (``failures``) and the clients caught deviating and
    left out of the step (``excluded``: client -> what it did), so the record outlives the log."""
    survivors, dropped = session.close_inputs()
    received = added_counts(session.received, earlier or {})
    report: dict[str, object] = {
        "survivors": len(survivors),
        "samples": aggregator.num_samples,
        "dropped": dropped,
        "threshold": session.threshold,
        "attempt": attempt,
        "bytes_received": received,
        "bytes_per_client": sum(received.values()) / clients,
    }
    if failures:
        report["failed"] = list(failures)
    if excluded:
        report["excluded"] = {str(i): why for i, why in sorted(excluded.items())}
    return report


def secagg_text(report: dict) -> str:
    dropped = f", dropped {report['dropped']}" if report["dropped"] else ""
    return f" [secure sum of {report['survivors']} clients{dropped}, {report['bytes_per_client'] / 1e6:.2f} MB/client]"


# ----------------------------------------------------------------------------- the coordinator's step


class SecureStep:
    """The coordinator's secure aggregation of one step over the wire: the session of its rounds,
    the fixed point, and the layout of the masked sums (set by the first masked input staged).

    Rounds close when every client they wait for has answered, or once ``late`` (the deadline has
    passed since the round opened: the step's start for the keys, the previous round's close for
    the others) with at least the threshold; then the masked inputs of the survivors are added (from
    the coordinator's staging, one vector in memory) and, with ``threshold`` unmask answers, the sum
    is unmasked and loaded into the step's aggregator. Each round gets the whole deadline: one
    measured from the step's start would close the share round at the threshold as soon as it
    opened late, and leave out clients that are alive, and sharers that die before their input
    would then leave fewer than the threshold for ever.

    A round past the deadline with fewer than the threshold of answers cannot close; if enough of the
    clients it no longer admits ask to take part (a client that restarted has lost its keys and masks),
    :meth:`stuck` says so and the coordinator :meth:`restart` s the step's secure aggregation: a fresh
    session (attempt 1, 2, ...; keys, masks and context all new) open to every client, the abandoned
    session's masked inputs discarded unread. Without enough such clients the step waits: fewer than
    the threshold can never be unmasked."""

    def __init__(
        self, settings: SecAggSettings, clients: int, plan: RoundPlan, layout: Layout, state: dict | None = None
    ) -> None:
        self.clients = clients
        self.fp = fixed_point(settings, clients)
        self.t = threshold(settings, clients)
        self.plan = plan
        self.layout = layout  # the step's masked sums, from its declaration: no client's input fixes it
        if state is None:
            self.attempt = 0
            self.earlier: dict[str, int] = {}  # bytes received in the step's abandoned sessions, per round
            self.excluded: dict[int, str] = {}  # clients caught deviating in this step, and what they did
            self.failures: list[str] = []  # why each failed session of the step failed
            self.session = ServerSession(self.members(), self.t, context(plan))
        else:  # resumed: the survivors' staged inputs are added again (resume_inputs) before anything else
            self.attempt, self.earlier = state.get("attempt", 0), dict(state.get("earlier", {}))
            self.excluded = {int(i): why for i, why in state.get("excluded", {}).items()}
            self.failures = list(state.get("failures", []))
            self.session = session_from_state(state["session"])
        self.resumed_survivors: list[int] | None = None if state is None else state["session"]["survivors"]
        self.opened = time.monotonic()  # when the open round began (resumed: the resume)
        self.knocking: set[int] = set()  # clients refused a place in this session since it began (alive, keyless)

    def members(self) -> list[int]:
        """The clients a fresh session of the step expects: all but those caught deviating in it."""
        return [i for i in range(self.clients) if i not in self.excluded]

    def plan_for_clients(self) -> RoundPlan:
        """The step's plan as clients pull it: naming the session they take part in."""
        return dataclasses.replace(self.plan, secure_attempt=self.attempt) if self.attempt else self.plan

    def stuck(self, deadline_s: float, arrived: Iterable[int]) -> bool:
        """Whether the open round is past ``deadline_s`` with fewer than the threshold of answers, and
        those with the clients knocking reach it (``arrived``: the inputs round's masked inputs staged)."""
        s = self.session
        if not self.late(deadline_s) or s.roster is None or s.ready(late=True):
            return False
        if s.sharers is None:
            answered = set(s.boxes)
        elif s.survivors is None:
            answered = set(arrived) & set(s.sharers)
        else:
            answered = set(s.revealed)
        return len(answered) < self.t <= len(answered | self.knocking)

    def restart(self, exclude: dict[int, str] | None = None) -> None:
        """A fresh session for the step (the next attempt): every client may take part again but those
        ``exclude`` names (client -> what it did), which stay out of the step's later sessions."""
        self.earlier = added_counts(self.earlier, self.session.received)
        self.excluded |= exclude or {}
        self.attempt += 1
        self.session = ServerSession(self.members(), self.t, context(self.plan_for_clients()))
        self.resumed_survivors, self.knocking = None, set()
        self.round_closed()

    def can_restart(self) -> bool:
        """Whether the clients not excluded can still reach the threshold (else no session can succeed)."""
        return len(self.members()) >= self.t

    def late(self, deadline_s: float) -> bool:
        """Whether the open round has waited longer than ``deadline_s`` (0: rounds wait for everyone)."""
        return deadline_s > 0 and time.monotonic() - self.opened > deadline_s

    def round_closed(self) -> None:
        """The next round opens now, with the whole deadline before it."""
        self.opened = time.monotonic()

    def state(self) -> dict:
        return {
            "session": session_state(self.session),
            "attempt": self.attempt,
            "earlier": self.earlier,
            "excluded": {str(i): why for i, why in self.excluded.items()},
            "failures": self.failures,
        }

    def may_join(self, index: int) -> bool:
        """Whether client ``index`` can still take part: before the roster is fixed, or in every round
        fixed so far. A client refused is remembered as knocking (alive, and asking to take part)."""
        s = self.session
        if index in self.excluded:
            return False  # caught deviating in this step: out of its later sessions (not knocking)
        if (s.roster is None or index in s.roster) and (s.sharers is None or index in s.sharers):
            return True
        self.knocking.add(index)
        return False

    def check_declared(self, declared: dict[str, tuple[str, tuple[int, ...]]], declared_bytes: int) -> None:
        """A masked push's headers (name -> (dtype, shape)) against the step's layout, before any byte is
        read: ``UpdateRejected`` unless they name exactly its masked sums, int64 limb pairs, of its size."""
        want = {f"{MASKED}/{name}": (*shape, 2) for name, shape in self.layout.entries}
        got = {name: tuple(shape) for name, (_, shape) in declared.items()}
        if got != want:
            missing, extra = sorted(set(want) - set(got)), sorted(set(got) - set(want))
            wrong = sorted(n for n in set(got) & set(want) if got[n] != want[n])
            raise UpdateRejected(
                "masked",
                f"a secure step's update carries the step's masked sums, as declared: missing {missing[:5]}, "
                f"unexpected {extra[:5]}, of another shape {wrong[:5]}",
            )
        if any(dtype != "int64" for dtype, _ in declared.values()):
            raise UpdateRejected("masked", "masked sums travel as int64 (the limbs of Z_2^128)")
        if declared_bytes != 16 * self.layout.size:
            raise UpdateRejected(
                "masked", f"declares {declared_bytes} bytes, the step's masked sums are {16 * self.layout.size}"
            )

    def check_masked(self, index: int, tensors: dict[str, Tensor]) -> None:
        """Client ``index``'s masked input, as its update's named tensors: ``SecAggError`` unless it is
        the client's turn, ``UpdateRejected`` unless it carries masked sums only, int64 limb pairs, in
        the step's layout."""
        s = self.session
        if s.sharers is None or index not in s.sharers or s.survivors is not None:
            raise SecAggError("an input from a client that shared no keys, or after the inputs closed")
        if not tensors or any(not name.startswith(MASKED + "/") for name in tensors):
            raise UpdateRejected("masked", "a secure step's update carries masked sums only (masked/<sum>)")
        if any(t.dtype != torch.int64 for t in tensors.values()):
            raise UpdateRejected("masked", "masked sums travel as int64 (the limbs of Z_2^128)")
        try:
            layout = Layout.of_masked({name.split("/", 1)[1]: t for name, t in tensors.items()})
        except SecAggError as err:
            raise UpdateRejected("masked", str(err)) from None
        if layout != self.layout:
            raise UpdateRejected("masked", "the masked sums' names or shapes differ from the step's declared sums")

    def add_input(self, update: ClientUpdate) -> None:
        vector = self.layout.flatten_ring(update.masked)
        self.session.masked_input(update.client_index, vector)

    def close_inputs(self, inputs: Iterable[ClientUpdate]) -> None:
        """Add the masked ``inputs`` (the survivors', from staging, one at a time) and fix ``U3``."""
        for update in inputs:
            self.add_input(update)
        self.session.close_inputs()

    def unmasked(self) -> tuple[dict[str, Tensor], int]:
        """The survivors' sum of terms (decoded) and how many survivors; ``Culprits`` or ``SecAggError``
        when the sum cannot be unmasked (a wrong share, a sum outside the fixed point's range)."""
        survivors, _ = self.session.close_inputs()
        total = decode(self.session.result(), self.fp, len(survivors))
        return unpack(self.layout.unflatten(total)), len(survivors)
