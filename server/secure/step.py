"""The coordinator's secure aggregation of one step, as a state machine of its own.

SecAgg's rounds (``common/secagg/rounds.py``) as the coordinator runs them over the wire: one handler
per stage a client calls (:meth:`SecureStep.call`), the rounds closing as their answers arrive or their
deadline passes (:meth:`SecureStep.advance`), the masked inputs held to the step's declared layout
(:meth:`SecureStep.check_push`, :meth:`SecureStep.submit`), and the unmasked sum loaded into the step's
aggregator (:meth:`SecureStep.unmask_into`). Every check says which attack it stops. A failure of one
party is recorded and survived: the session restarts, the clients the protocol can name left out, and
after ``secagg.max_attempts`` failed sessions the step ends unmerged (:class:`SessionFailed`). The
coordinator keeps the lock, the staging on disk (:class:`~server.secure.staging.Staging`) and what a finished
step does next. The handlers themselves are :mod:`server.secure.stages`; the masked inputs' form against the
layout, their sum and its unmasking, :mod:`server.secure.masked`.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass

from torch import Tensor

from common.aggregation.base import Aggregator
from common.aggregation.validate import UpdateRejected
from common.infra.faults import fault_point
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.persistence import session_from_state, session_state
from common.secagg.primitives import SecAggError
from common.secagg.rounds import Culprits, Keys, key_fingerprints
from common.secagg.server_session import ServerSession
from common.secagg.signing import Verifier, check_signature
from common.secagg.terms import Layout, context, run_encoding, step_graph, threshold
from common.wire.messages import ClientUpdate, RoundPlan
from server.checks import Refused
from server.secure.masked import check_declared, check_tensors, close_inputs, unmasked
from server.secure.report import added_counts, secagg_report
from server.secure.stages import HANDLERS, Reply
from server.secure.staging import Staging, fingerprint
from server.secure.sums import load_sums

MAX_DEADLINE_GROWTH = 8  # a fresh session's rounds wait up to this many times the step's deadline
POLLS_PER_S = 200  # the waiting clients of a secure step, all together, are told to ask about this often


@dataclass(frozen=True)
class Timing:
    deadline_s: float  # how long a round waits for everyone before it closes with the threshold (0: for ever)
    retry_after_s: float  # what a client asking too early is told


class SessionFailed(Exception):
    """The session's sum could not be unmasked. ``record``: ``None`` when a fresh session started; else the
    step gave up (too many failed sessions, or too few clients left), and this is what its history keeps."""

    def __init__(self, record: dict | None) -> None:
        super().__init__("the step's secure aggregation failed" + ("" if record is None else " for good"))
        self.record = record


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
        self,
        settings: SecAggSettings,
        clients: int,
        plan: RoundPlan,
        layout: Layout,
        staging: Staging,
        timing: Timing,
        where: str = "secure aggregation",
        emit: Callable[[str], None] = lambda message: None,
        state: dict | None = None,
        awaited: Callable[[], Collection[int]] | None = None,
        dp: DpSettings | None = None,
        verifier: Verifier | None = None,
    ) -> None:
        self.clients = clients
        # Signed mode: the run's CA, by which each advertise's certificate is checked when it arrives (None: the
        # certificate's own signature and identity only; the clients check the CA, and refuse a roster that fails).
        self.verifier = verifier
        self.seen = staging.seen_keys()  # keys of the run's earlier sessions: one advertised again is a replay
        # The slots the keys round waits for (``Run.awaited``: in a --start-with run, those a client has joined).
        # None: every slot.
        self.awaited = awaited
        # dp.mode = distributed: the clients' noise is in every masked input, and the fixed point is the noise's
        self.fp, self.noise = run_encoding(settings, dp or DpSettings(), clients)
        self.settings = settings
        self.t = threshold(settings, clients)  # on a sparse graph, a neighbourhood's
        self.signed = settings.mode == "signed"
        self.max_attempts = settings.max_attempts
        self.plan = plan
        self.layout = layout  # the step's masked sums, from its declaration: no client's input fixes it
        self.staging, self.timing, self.where, self.emit = staging, timing, where, emit
        if state is None:
            self.attempt = 0
            self.earlier: dict[str, int] = {}  # bytes received in the step's abandoned sessions, per round
            self.excluded: dict[int, str] = {}  # clients caught deviating in this step, and what they did
            self.failures: list[str] = []  # why each failed session of the step failed
            self.proofs: dict[int, dict] = {}  # signed mode: excluded client -> the evidence, for the clients to check
            self.session = self._session()
        else:  # resumed: the survivors' staged inputs are added again (resume) before anything else
            self.attempt, self.earlier = state.get("attempt", 0), dict(state.get("earlier", {}))
            self.excluded = {int(i): why for i, why in state.get("excluded", {}).items()}
            self.failures = list(state.get("failures", []))
            self.proofs = {int(i): proof for i, proof in state.get("proofs", {}).items()}
            ctx = bytes.fromhex(state["session"]["context"])
            self.session = session_from_state(state["session"], step_graph(settings, clients, ctx))
            self.session.check = self._check
        self.resumed_survivors: list[int] | None = None if state is None else state["session"]["survivors"]
        self.opened = time.monotonic()  # when the open round began (resumed: the resume)
        self.knocking: set[int] = set()  # clients refused a place in this session since it began (alive, keyless)
        if state is None:  # the state the clients' records are appended to (server.secure.staging)
            self.staging.save(self.state())

    def _check(self, certificate: bytes, message: bytes, signature: bytes) -> object:
        """A signature under a client's certificate: the run CA's when the coordinator has it (signed mode)."""
        if self.verifier is not None:
            return self.verifier.verify(certificate, message, signature)
        check_signature(certificate, message, signature)
        return None

    def _session(self) -> ServerSession:
        """A fresh session of the step's open attempt."""
        ctx = context(self.plan_for_clients())
        check = self._check if self.signed else None
        graph = step_graph(self.settings, self.clients, ctx)
        return ServerSession(self.members(), self.t, ctx, signed=self.signed, check=check, graph=graph)

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
        self.remember(self.session.keys.values())  # the abandoned session's keys may not come back either
        self.earlier = added_counts(self.earlier, self.session.received)
        self.excluded |= exclude or {}
        self.attempt += 1
        self.session = self._session()
        self.resumed_survivors, self.knocking = None, set()
        self.round_closed()

    def remember(self, keys: Iterable[Keys]) -> None:
        """Record ``keys``' fingerprints as the run's: no later session takes them (the advertise stage,
        :mod:`server.secure.stages`)."""
        known = self.session.prints  # the open session's, computed at advertise
        prints = {fingerprint(p) for k in keys for p in known.get(k.index) or key_fingerprints(k)}
        self.seen |= prints
        self.staging.remember_keys(prints)

    def can_restart(self) -> bool:
        """Whether the clients not excluded can still reach the threshold (else no session can succeed)."""
        return len(self.members()) >= self.t

    def keys_complete(self) -> bool:
        """Every client the keys round waits for has advertised: each expected slot that a client holds, and at
        least the threshold of them."""
        s = self.session
        waited = set(s.expected) if self.awaited is None else set(s.expected) & set(self.awaited())
        return len(s.keys) >= self.t and waited <= set(s.keys)

    def poll_s(self) -> float:
        """What a client asking too early is told to wait: the coordinator's ``retry_after_s``, or longer, so that
        the step's clients together ask at most :data:`POLLS_PER_S` times a second (every call takes the
        coordinator's lock: a thousand clients asking five times a second kept it busy answering "not yet", and the
        calls that would close the round were refused as over its limit)."""
        return max(self.timing.retry_after_s, self.clients / POLLS_PER_S)

    def deadline_s(self) -> float:
        """The open session's round deadline: the step's, doubled for each fresh session up to
        :data:`MAX_DEADLINE_GROWTH` times. A session that failed because its rounds closed at the deadline on live
        clients still computing (a large population on a loaded host: they share and mask in turn) would fail the
        same way again at the same deadline, for ever."""
        return self.timing.deadline_s * min(2**self.attempt, MAX_DEADLINE_GROWTH)

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
            "proofs": {str(i): proof for i, proof in self.proofs.items()},
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

    def check_masked(self, index: int, tensors: dict[str, Tensor]) -> None:
        """Client ``index``'s masked input, as its update's named tensors: ``SecAggError`` unless it is
        the client's turn, ``UpdateRejected`` unless it carries masked sums only, int64 limb pairs, in
        the step's layout (:func:`~server.secure.masked.check_tensors`)."""
        s = self.session
        if s.sharers is None or index not in s.sharers or s.survivors is not None:
            raise SecAggError("an input from a client that shared no keys, or after the inputs closed")
        check_tensors(self.layout, tensors)

    # ------------------------------------------------------------ the coordinator's calls

    def resume(self) -> None:
        """After a restart of the coordinator, with the staged submissions listed in ``staging.submitted``:
        masked inputs staged before the share round closed belong to an abandoned session (never read);
        if the inputs had closed, the survivors' are added again."""
        if self.session.sharers is None and self.staging.submitted:
            self.staging.drop()
        if self.resumed_survivors is not None:
            close_inputs(self.session, self.layout, (self.staging.load(i) for i in self.resumed_survivors))

    def advance(self) -> bool:
        """Close whatever round is complete (or late, with the threshold), restart a session stuck below the
        threshold while clients ask to take part, persist; ``True`` once the unmask answers suffice."""
        deadline, t = self.deadline_s(), self.t
        if self.stuck(deadline, self.staging.submitted):
            waiting = sorted(self.knocking)
            self.restart()  # persisted before the abandoned inputs go: a crash between leaves them unread
            self.staging.save(self.state())
            fault_point("secagg.restarted")  # the fresh session on disk, the abandoned inputs still staged
            self.staging.drop()
            deadline = self.deadline_s()
            self.emit(
                f"{self.where}: fewer than the threshold {t} answered in time and clients {waiting} ask to take "
                f"part: restarted with fresh keys (attempt {self.attempt}; its rounds wait {deadline:g} s)"
            )
        s, changed = self.session, False
        # Each round is late by its own deadline: self.late() is read afresh after every round that closes.
        if s.roster is None and (self.keys_complete() or (self.late(deadline) and s.enough(list(s.keys)))):
            self.remember(s.close_keys().values())  # before the roster is persisted: no replay after a crash
            self.round_closed()
            changed = True
            self.emit(f"{self.where}: roster of {len(s.keys)} clients (threshold {t})")
        if (
            s.roster is not None
            and s.sharers is None
            and (len(s.boxes) == len(s.roster) or (self.late(deadline) and s.enough(list(s.boxes))))
        ):
            s.close_shares()
            self.round_closed()
            changed = True
        if s.sharers is not None and s.survivors is None:
            arrived = sorted(self.staging.submitted & set(s.sharers))
            if len(arrived) == len(s.sharers) or (self.late(deadline) and s.enough(arrived)):
                close_inputs(s, self.layout, (self.staging.load(i) for i in arrived))
                self.round_closed()
                changed = True
                dropped = sorted(set(s.sharers) - set(arrived))
                self.emit(
                    f"{self.where}: masked inputs of {len(arrived)} clients"
                    + (f", dropped {dropped}" if dropped else "")
                )
        if changed:
            self.staging.save(self.state())
        return s.ready(late=self.late(deadline))

    def check_push(
        self, attempt: int, declared: dict[str, tuple[str, tuple[int, ...]]] | None, declared_bytes: int
    ) -> None:
        """A masked push's envelope, before any byte of it is read: masks of an abandoned session are never
        read (``ABORTED``: pull the plan again); the headers must declare the step's masked sums exactly
        (no first pusher decides the layout; no header allocates more than the step's sums)."""
        self._same_session(attempt)
        if declared is not None:
            try:
                check_declared(self.layout, declared, declared_bytes)
            except UpdateRejected as err:
                raise Refused("INVALID_ARGUMENT", str(err)) from err

    def submit(self, update: ClientUpdate, idempotency_key: str) -> None:
        """A masked input: checked for form only (its values say nothing), staged; the inputs close when
        every client that shared has sent one (or late, with the threshold)."""
        self._same_session(update.secure_attempt)
        try:
            self.check_masked(update.client_index, update.tensors)
        except SecAggError as err:  # not this client's turn: the round is over, or it never shared keys
            raise Refused("FAILED_PRECONDITION", str(err)) from err
        except UpdateRejected as err:
            raise Refused("INVALID_ARGUMENT", str(err)) from err
        self.staging.stage(update, idempotency_key)

    def call(
        self, stage: str, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes], attempt: int
    ) -> Reply | None:
        """Client ``index``'s call of ``stage`` in session ``attempt``: what it asks for (``ready`` False while
        that is not fixed yet), or ``None`` once what it sent is recorded. ``Refused`` naming what is wrong;
        a client refused by the session is remembered as alive (knocking)."""
        self._same_session(attempt)
        handler = HANDLERS.get(stage)
        if handler is None:
            raise Refused("INVALID_ARGUMENT", f"unknown secure aggregation stage {stage!r}")
        try:
            return handler(self, index, client_id, keys, shares)
        except SecAggError as err:
            self.knocking.add(index)  # alive, but no longer able to take part in this session
            raise Refused("FAILED_PRECONDITION", str(err)) from err

    def unmask_into(self, aggregator: Aggregator) -> dict:
        """Load the survivors' unmasked sum into ``aggregator``; what the step's history records. A sum that
        cannot be unmasked or fails its checks: :class:`SessionFailed` (see :meth:`_failed`)."""
        try:
            sums, survivors = unmasked(self.session, self.layout, self.fp)
            slack = self.noise.gram_slack(self.layout.entries, survivors) if self.noise is not None else 0.0
            load_sums(
                aggregator,
                sums,
                survivors,
                16 * self.layout.size * survivors,
                slack,
                self.fp.error_bound(survivors),
                self.noise is not None,
            )
        except (SecAggError, UpdateRejected) as err:  # Culprits is a SecAggError
            self._failed(err)
        blamed, unresolved = self.session.complaint_verdicts()
        for i, why in sorted(blamed.items()):
            self.emit(f"{self.where} (attempt {self.attempt}): client {i} {why}; its pairs' shares were left out")
        for line in unresolved:
            self.emit(f"{self.where} (attempt {self.attempt}): unresolved complaint: {line}")
        return secagg_report(
            self.session, self.clients, aggregator, self.attempt, self.earlier, self.failures, self.excluded
        )

    def _failed(self, err: Exception) -> None:
        """Clients the protocol names (``Culprits``) are excluded from the step, and a fresh session starts
        (keys, masks and context new), unless the step has failed ``max_attempts`` sessions or too few
        clients are left for the threshold; then the step gives up. Raises :class:`SessionFailed`."""
        where = f"{self.where} (attempt {self.attempt})"
        culprits = err.why if isinstance(err, Culprits) else {}
        if isinstance(err, Culprits):  # signed mode: the evidence the clients check before a restart
            self.proofs |= {i: {"attempt": self.attempt, **proof} for i, proof in err.proofs.items()}
        self.failures.append(f"{type(err).__name__}: {err}")
        named = f"; excluding clients {sorted(culprits)} from the step" if culprits else "; nobody can be named"
        self.emit(f"{where} failed: {err}{named}")
        self.restart(exclude=culprits)
        if len(self.failures) < self.max_attempts and self.can_restart():
            self.staging.save(self.state())  # before the abandoned inputs go (as in a stuck restart)
            fault_point("secagg.restarted")
            self.staging.drop()
            self.emit(
                f"{where}: restarted with fresh keys (attempt {self.attempt}) without clients {sorted(self.excluded)}"
            )
            raise SessionFailed(None)
        raise SessionFailed({"failed": self.failures, "excluded": {str(i): w for i, w in self.excluded.items()}})

    def _same_session(self, attempt: int) -> None:
        """A call, push or mask of another session than the open one: the step restarted since."""
        if attempt != self.attempt:
            raise Refused(
                "ABORTED", f"this step's secure aggregation restarted (attempt {self.attempt}, not {attempt})"
            )
