"""The coordinator's secure aggregation of one step, as a state machine of its own (issue 42).

SecAgg's rounds (``common/secagg/rounds.py``) as the coordinator runs them over the wire: one handler
per stage a client calls (:meth:`SecureStep.call`), the rounds closing as their answers arrive or their
deadline passes (:meth:`SecureStep.advance`), the masked inputs held to the step's declared layout
(:meth:`SecureStep.check_push`, :meth:`SecureStep.submit`), and the unmasked sum loaded into the step's
aggregator (:meth:`SecureStep.unmask_into`). Every check says which attack it stops. A failure of one
party is recorded and survived: the session restarts, the clients the protocol can name left out, and
after ``secagg.max_attempts`` failed sessions the step ends unmerged (:class:`SessionFailed`). The
coordinator keeps the lock, the staging on disk (:class:`Staging`) and what a finished step does next.
"""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass
from typing import Any

import torch
from torch import Tensor

from common.aggregation.base import Aggregator
from common.aggregation.validate import UpdateRejected
from common.infra.faults import fault_point
from common.infra.files import atomic_write_json
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.persistence import session_from_state, session_state
from common.secagg.primitives import SecAggError, decode
from common.secagg.rounds import Culprits, Keys, key_fingerprints
from common.secagg.server_session import ServerSession
from common.secagg.signed_messages import keys_message
from common.secagg.signing import Verifier, certificate_identity, check_signature
from common.secagg.terms import Layout, context, run_encoding, threshold, unpack
from common.wire.messages import ClientUpdate, RoundPlan
from common.wire.tensors import MASKED
from server.checks import Refused
from server.secure.report import added_counts, secagg_report
from server.secure.sums import load_sums
from server.store import Store


@dataclass
class Staging:
    """The open step's staged submissions, as its secure aggregation sees them: the coordinator's store
    under the step's key, and the step's own set of indices whose submission is staged."""

    store: Store
    key: str
    submitted: set[int]

    def save(self, state: dict) -> None:
        self.store.save_secagg(self.key, state)

    def load(self, index: int) -> ClientUpdate:
        return self.store.load_update(self.key, index)

    def stage(self, update: ClientUpdate, idempotency_key: str) -> None:
        self.store.stage_update(self.key, update, idempotency_key)
        fault_point("push.staged")
        self.submitted.add(update.client_index)

    def drop(self) -> None:
        """Forget the staged masked inputs (an abandoned session's), on disk and in memory."""
        self.store.drop_updates(self.key)
        self.submitted.clear()

    def seen_keys(self) -> set[str]:
        """The fingerprints (hex) of every public key advertised in the run's earlier secure sessions."""
        path = self.store.root / SEEN_KEYS
        return set(json.loads(path.read_text())) if path.exists() else set()

    def remember_keys(self, fingerprints: Iterable[str]) -> None:
        """Add ``fingerprints`` to the run's record of advertised keys (kept beside its generations: the
        staging of a step is dropped once it is merged, the record outlives it)."""
        seen = self.seen_keys()
        if not set(fingerprints) <= seen:
            atomic_write_json(self.store.root / SEEN_KEYS, sorted(seen | set(fingerprints)))


SEEN_KEYS = "secagg-seen-keys.json"  # in the store's root: 16 bytes of each key's fingerprint, hex, one list


def fingerprint(point: bytes) -> str:
    """What the run's record of keys holds of a key's fingerprint (:func:`key_fingerprints`): 16 bytes, hex."""
    return point[:16].hex()


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


Reply = dict[str, Any]


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
        self.t = threshold(settings, clients)
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
            self.session = session_from_state(state["session"])
            self.session.check = self._check
        self.resumed_survivors: list[int] | None = None if state is None else state["session"]["survivors"]
        self.opened = time.monotonic()  # when the open round began (resumed: the resume)
        self.knocking: set[int] = set()  # clients refused a place in this session since it began (alive, keyless)

    def _check(self, certificate: bytes, message: bytes, signature: bytes) -> object:
        """A signature under a client's certificate: the run CA's when the coordinator has it (signed mode)."""
        if self.verifier is not None:
            return self.verifier.verify(certificate, message, signature)
        check_signature(certificate, message, signature)
        return None

    def _session(self) -> ServerSession:
        """A fresh session of the step's open attempt."""
        ctx = context(self.plan_for_clients())
        return ServerSession(
            self.members(), self.t, ctx, signed=self.signed, check=self._check if self.signed else None
        )

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
        """Record ``keys``' fingerprints as the run's: no later session takes them (:meth:`_advertise`)."""
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

    def check_declared(self, declared: dict[str, tuple[str, tuple[int, ...]]], declared_bytes: int) -> None:
        """A masked push's headers (name -> (dtype, shape)) against the step's layout, before any byte is
        read: ``UpdateRejected`` unless they name exactly its masked sums, int64 limb pairs, of its size."""
        int64 = all(dtype == "int64" for dtype, _ in declared.values())
        self._check_sums({name: tuple(shape) for name, (_, shape) in declared.items()}, int64)
        if declared_bytes != 16 * self.layout.size:
            raise UpdateRejected(
                "masked", f"declares {declared_bytes} bytes, the step's masked sums are {16 * self.layout.size}"
            )

    def check_masked(self, index: int, tensors: dict[str, Tensor]) -> None:
        """Client ``index``'s masked input, as its update's named tensors: ``SecAggError`` unless it is
        the client's turn, ``UpdateRejected`` unless it carries masked sums only, int64 limb pairs, in
        the step's layout (what :meth:`check_declared` holds a push's headers to)."""
        s = self.session
        if s.sharers is None or index not in s.sharers or s.survivors is not None:
            raise SecAggError("an input from a client that shared no keys, or after the inputs closed")
        int64 = all(t.dtype == torch.int64 for t in tensors.values())
        self._check_sums({name: tuple(t.shape) for name, t in tensors.items()}, int64)

    def _check_sums(self, shapes: dict[str, tuple[int, ...]], int64: bool) -> None:
        """``shapes`` (wire name -> shape) must be exactly the step's masked sums, each entry a pair of int64
        limbs: the layout comes from the step's declaration, so no first pusher decides it."""
        want = {f"{MASKED}/{name}": (*shape, 2) for name, shape in self.layout.entries}
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

    def add_input(self, update: ClientUpdate) -> None:
        vector = self.layout.flatten_ring(update.named(MASKED))
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

    # ------------------------------------------------------------ the coordinator's calls

    def resume(self) -> None:
        """After a restart of the coordinator, with the staged submissions listed in ``staging.submitted``:
        masked inputs staged before the share round closed belong to an abandoned session (never read);
        if the inputs had closed, the survivors' are added again."""
        if self.session.sharers is None and self.staging.submitted:
            self.staging.drop()
        if self.resumed_survivors is not None:
            self.close_inputs(self.staging.load(i) for i in self.resumed_survivors)

    def advance(self) -> bool:
        """Close whatever round is complete (or late, with the threshold), restart a session stuck below the
        threshold while clients ask to take part, persist; ``True`` once the unmask answers suffice."""
        deadline, t = self.timing.deadline_s, self.t
        if self.stuck(deadline, self.staging.submitted):
            waiting = sorted(self.knocking)
            self.restart()  # persisted before the abandoned inputs go: a crash between leaves them unread
            self.staging.save(self.state())
            fault_point("secagg.restarted")  # the fresh session on disk, the abandoned inputs still staged
            self.staging.drop()
            self.emit(
                f"{self.where}: fewer than the threshold {t} answered in time and clients {waiting} ask to take "
                f"part: restarted with fresh keys (attempt {self.attempt})"
            )
        s, changed = self.session, False
        # Each round is late by its own deadline: self.late() is read afresh after every round that closes.
        if s.roster is None and (self.keys_complete() or (self.late(deadline) and len(s.keys) >= t)):
            self.remember(s.close_keys().values())  # before the roster is persisted: no replay after a crash
            self.round_closed()
            changed = True
            self.emit(f"{self.where}: roster of {len(s.keys)} clients (threshold {t})")
        if (
            s.roster is not None
            and s.sharers is None
            and (len(s.boxes) == len(s.roster) or (self.late(deadline) and len(s.boxes) >= t))
        ):
            s.close_shares()
            self.round_closed()
            changed = True
        if s.sharers is not None and s.survivors is None:
            arrived = sorted(self.staging.submitted & set(s.sharers))
            if len(arrived) == len(s.sharers) or (self.late(deadline) and len(arrived) >= t):
                self.close_inputs(self.staging.load(i) for i in arrived)
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
                self.check_declared(declared, declared_bytes)
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
        handler = self.HANDLERS.get(stage)
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
            sums, survivors = self.unmasked()
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

    # ------------------------------------------------------------ one handler per stage

    def _advertise(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
        """Client ``index``'s keys, each check refusing (``INVALID_ARGUMENT``, or ``PERMISSION_DENIED``) what would
        otherwise reach every honest client. A refused advertise leaves the slot as it was: open for the
        client's own, which is then taken."""
        if keys is None:
            raise Refused("INVALID_ARGUMENT", "an advertise carries the client's keys")
        if keys.index != index:  # the body's index is the caller's claim, not its identity (H1)
            raise Refused(
                "PERMISSION_DENIED",
                f"client {client_id!r} holds index {index}: it cannot advertise keys for index {keys.index}",
            )
        try:
            # A low-order or non-canonical point: every honest client's exchange with it fails or is public.
            prints = key_fingerprints(keys)
            self._check_signed(index, client_id, keys)
        except SecAggError as err:
            raise Refused("INVALID_ARGUMENT", f"client {index}'s advertise is refused: {err}") from err
        current = self.session.keys.get(index)
        if current != keys and any(fingerprint(p) in self.seen for p in prints):
            # A copy of an earlier step's (or session's) advertise: taken, it would fill the client's slot with
            # keys whose private halves belong to a finished session, and refuse the client's own advertise.
            raise Refused(
                "INVALID_ARGUMENT",
                f"client {index}'s advertise is refused: a public key of an earlier secure session of this run "
                "(a replay; every session's keys are fresh)",
            )
        self.session.advertise(keys)  # distinct keys, the roster still open, one of the step's clients
        self.staging.save(self.state())

    def _check_signed(self, index: int, client_id: str, keys: Keys) -> None:
        """Signed mode: the advertise's signature covers this session's context, the index and the keys, and
        its certificate names the caller. The clients check the same of every roster entry (and the CA, which
        ``self.verifier`` checks here too when given); one bad entry makes each of them refuse the session, so
        a client's forged or replayed advertise must stop here."""
        if not self.signed:
            return
        if not keys.certificate or not keys.signature:
            raise SecAggError("the run is signed: an advertise carries the client's certificate and signature")
        k = keys
        identity = (self.verifier.identity if self.verifier else certificate_identity)(k.certificate)
        message = keys_message(self.session.context, index, identity, k.cipher_public, k.mask_public, k.commitment)
        self._check(k.certificate, message, k.signature)
        if identity != client_id:
            raise SecAggError(f"its certificate names client {identity!r}, but client {client_id!r} sent it")

    def _roster(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
        s = self.session
        if s.roster is None:
            return self._wait(f"{len(s.keys)}/{len(s.expected)} clients advertised keys")
        return {"ready": True, "roster": list(s.roster.values())}

    def _share(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
        self.session.share(index, shares)  # one box of the protocol's size for each other roster client
        self.staging.save(self.state())

    def _inbox(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
        s = self.session
        if s.sharers is None:
            return self._wait(f"{len(s.boxes)}/{len(s.roster or {})} clients shared keys")
        if index not in s.sharers:
            raise SecAggError("the share round closed without this client")
        return {"ready": True, "sharers": s.sharers, "shares": s.inbox(index)}

    def _unmask(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
        if self.session.survivors is None:
            return self._wait("waiting for the masked inputs")
        survivors, dropped = self.session.close_inputs()
        return {"ready": True, "survivors": survivors, "dropped": dropped}

    def _confirm(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
        if not self.signed:
            raise SecAggError("this run's secure aggregation is not signed: there is no consistency round")
        self.session.confirm(index, shares.get(index, b""))  # relayed; the clients verify the signatures
        self.staging.save(self.state())

    def _confirmations(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
        s = self.session
        if not s.confirmed(late=self.late(self.timing.deadline_s)):
            return self._wait(f"{len(s.confirmations)} survivors confirmed the unmask request")
        return {"ready": True, "shares": dict(s.confirmations)}

    def _reveal(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
        self.session.reveal(index, shares)  # a survivor's answer: one share of the right size per client
        self.staging.save(self.state())
        fault_point("secagg.revealed")

    def _blame(self, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
        """Signed mode: the proofs against the clients excluded from the step (client -> JSON), by which a client
        that answered an earlier session checks that the restart leaves out only clients proven to deviate."""
        if not self.signed:
            raise SecAggError("this run's secure aggregation is not signed: there is no blame to prove")
        return {"ready": True, "shares": {i: json.dumps(p, sort_keys=True).encode() for i, p in self.proofs.items()}}

    def _wait(self, message: str) -> Reply:
        return {"ready": False, "retry_after_s": self.timing.retry_after_s, "message": message}

    HANDLERS: dict[str, Callable[..., Reply | None]] = {
        "advertise": _advertise,
        "roster": _roster,
        "share": _share,
        "inbox": _inbox,
        "unmask": _unmask,
        "confirm": _confirm,
        "confirmations": _confirmations,
        "reveal": _reveal,
        "blame": _blame,
    }
