"""A client's secure-aggregation rounds of one step over the wire (settings ``secagg.*``).

Before training (:meth:`SecureRounds.begin`): advertise fresh keys, wait for the roster, send the
sealed shares. After training (:meth:`SecureRounds.finish`): wait for the clients that shared,
check the update and fold it into a fresh aggregator of the step, the one the coordinator folds into
(``common.aggregation.base.make_aggregator``, ``common/secagg/terms.py``), push the terms masked, wait for the
unmask request and answer it.

In the signed mode (``secagg.mode = signed``, against a coordinator that deviates) the keys are
signed with the client's mTLS key and every roster entry is checked against the run's CA, and the
client signs the unmask request and waits for the threshold's signatures over the same request
before it reveals anything (``common/secagg/client_session.py``). A restart of a session this client answered
it answers only for the same survivors less the clients the coordinator proves to have dealt wrong shares
(:func:`common.secagg.blame.check_blame`, each proof under the dealer's own signatures): anyone else left out
would make the two sums' difference an honest client's input.
"""

from __future__ import annotations

import dataclasses
import json
import logging
from collections.abc import Callable

from client.transport import Transport
from common.aggregation.base import make_aggregator
from common.infra.faults import fault_point
from common.infra.tls import Security
from common.run.config import RunConfig
from common.run.settings import DpSettings, SecAggSettings
from common.secagg.blame import check_blame
from common.secagg.client_session import ClientSession
from common.secagg.primitives import SecAggError
from common.secagg.signing import Signer, Verifier
from common.secagg.terms import client_terms, context, masked_update, run_encoding, step_graph
from common.wire.messages import ClientUpdate, ModelSpec, RoundPlan

log = logging.getLogger("lorm.client")


class SessionRefused(SecAggError):
    """This client sits out the step's secure session; the run goes on.

    Raised by :meth:`SecureRounds.begin` and :meth:`SecureRounds.finish` when what the coordinator relays fails
    this client's checks: a roster entry with a low-order or non-canonical key, a repeated key or a signature
    that does not verify (the coordinator refuses each at advertise, so it deviated or let one through), or an
    unmask request that could reveal an input. The client has revealed nothing it should not and sends nothing
    more in this session; the step goes on without it, or restarts. A box that does not open is no reason to
    refuse: that sender's share is left out and reported (:meth:`common.secagg.client_session.ClientSession.reveal`)."""


def signing(settings: SecAggSettings, security: Security | None) -> tuple[Signer | None, Verifier | None]:
    """The client's signer and the run CA's verifier in the signed mode (``None, None`` otherwise); a
    ``SecAggError`` naming what is missing when the mode needs a certificate the client does not have."""
    if settings.mode != "signed":
        return None, None
    if security is None or not (security.cert and security.key and security.ca):
        raise SecAggError(
            "secagg.mode = signed: the client signs its keys with its mTLS certificate and checks the others' against "
            "the run's CA: pass --tls-cert, --tls-key and --tls-ca"
        )
    return Signer.from_files(security.cert, security.key), Verifier(security.ca)


class SecureRounds:
    """Client ``index``'s side of ``plan``'s step; the step's aggregator is built from the run's configuration."""

    def __init__(
        self,
        client: Transport,
        config: RunConfig,
        spec: ModelSpec,
        index: int,
        plan: RoundPlan,
        security: Security | None = None,
        answered: list[int] | None = None,
    ) -> None:
        settings = config.section(SecAggSettings)
        self.client, self.index, self.plan = client, index, plan
        # Signed mode, a restart of a session this client answered: that session's survivors (else None)
        self.answered = answered
        self.spec, self.config = spec, config
        self.fp, self.noise = run_encoding(settings, config.section(DpSettings), config.num_clients)
        signer, verifier = signing(settings, security)
        ctx = context(plan)
        graph = step_graph(settings, config.num_clients, ctx)  # drawn here from the plan: never the coordinator's
        self.session = ClientSession(index, graph.threshold, ctx, signer=signer, verifier=verifier, graph=graph)

    def _until_ready(self, stage: str) -> dict:
        """Ask ``stage`` until the coordinator has fixed it (it answers not-ready meanwhile)."""
        while True:
            reply = self.client.secagg(self.plan, self.index, stage)
            if reply["ready"]:
                return reply
            self.client.pause(max(reply["retry_after_s"], 0.05))

    def _refuse(self, err: SecAggError) -> SessionRefused:
        p = self.plan
        where = f"task {p.task} round {p.round} {p.phase.value} secure session {p.secure_attempt}"
        return SessionRefused(f"{where}: client {self.index} sits it out: {err}")

    def begin(self) -> None:
        """Advertise, then share among the roster; :class:`SessionRefused` when the roster fails the checks."""
        self.client.secagg(self.plan, self.index, "advertise", keys=self.session.advertise())
        roster = self._until_ready("roster")["roster"]
        try:
            shares = self.session.share(roster)
        except SecAggError as err:
            raise self._refuse(err) from err
        self.client.secagg(self.plan, self.index, "share", shares=shares)

    def finish(
        self,
        update: ClientUpdate,
        push: Callable[[ClientUpdate], object],
        unmasking: Callable[[list[int]], None] | None = None,
    ) -> int:
        """Mask and push ``update``'s terms with ``push``, then answer the unmask request; returns how
        many clients' sum the coordinator unmasks. ``unmasking``: called with the survivors, before anything is
        revealed, when the request counts this client among at least the threshold's survivors (from then on the
        sum, this client's noised terms in it, can be unmasked)."""
        inbox = self._until_ready("inbox")
        # the step's aggregator, whose folding defines the terms: what the coordinator would have folded is masked
        terms = client_terms(make_aggregator(self.plan, self.spec, self.config), update)  # UpdateRejected: not sent
        sharers, attempt = inbox["sharers"], self.plan.secure_attempt
        masked = masked_update(
            update, terms, self.session, sharers, self.fp, attempt, self.noise, self.plan.class_range
        )
        fault_point("client.masked")
        push(masked)
        request = self._until_ready("unmask")
        survivors, dropped = request["survivors"], request["dropped"]
        if self.index not in survivors:
            log.info("the coordinator closed the inputs without this client's; it does not answer")
            return len(survivors)
        try:
            if self.answered is not None:
                self.check_restart(survivors)
            if unmasking is not None and len(survivors) >= self.session.threshold:
                unmasking(survivors)
            answer = self._answer(inbox["shares"], survivors, dropped)
        except SecAggError as err:
            raise self._refuse(err) from err
        if self.session.complaints:
            log.warning(
                "secure aggregation: the shares of clients %s for this client do not open; answering without them "
                "and reporting them to the coordinator",
                self.session.complaints,
            )
        self.client.secagg(self.plan, self.index, "reveal", shares=answer)
        return len(survivors)

    def check_restart(self, survivors: list[int]) -> None:
        """Signed mode, the restart of a session this client answered (survivors ``self.answered``): ``SecAggError``
        unless ``survivors`` are exactly those less the clients the coordinator's proofs show to have dealt shares of
        another secret than they committed to (:func:`common.secagg.blame.check_blame`, each checked here under the
        run's CA and the session it names). Then the two sums differ by the proven clients' inputs alone."""
        assert self.session.verifier is not None, "a restart is checked in the signed mode"
        proofs = self._until_ready("blame")["shares"]
        proven: set[int] = set()
        refused: list[str] = []
        for culprit, data in sorted(proofs.items()):
            try:
                proof = json.loads(data)
                attempt = int(proof["attempt"])
                if not 0 <= attempt < self.plan.secure_attempt:
                    raise SecAggError(f"a proof of session {attempt}, not an earlier one")
                earlier = context(dataclasses.replace(self.plan, secure_attempt=attempt))
                dealer = check_blame(proof, self.session.verifier, earlier, self.session.threshold)
            except (SecAggError, ValueError, KeyError, TypeError, RecursionError) as err:
                refused.append(f"client {culprit}: {str(err)[:200]}")
                continue
            proven.add(dealer)
        want = sorted(set(self.answered or []) - proven)
        if sorted(survivors) != want:
            raise SecAggError(
                f"the restart asks to unmask the sum of clients {sorted(survivors)}, but this client answered an "
                f"earlier session of the step for clients {sorted(self.answered or [])}, and only {sorted(proven)} are "
                f"proven to have deviated{' (refused proofs: ' + '; '.join(refused) + ')' if refused else ''}: the two "
                "sums would differ by another client's input"
            )

    def _answer(self, boxes: dict[int, bytes], survivors: list[int], dropped: list[int]) -> dict[int, bytes]:
        """The unmask answer, after the consistency round in the signed mode (the same request, signed by the
        threshold)."""
        confirmations = None
        if self.session.signer is not None:
            signature = self.session.confirm(survivors, dropped)
            self.client.secagg(self.plan, self.index, "confirm", shares={self.index: signature})
            confirmations = self._until_ready("confirmations")["shares"]
        return self.session.reveal(boxes, survivors, dropped, confirmations)
