"""One handler per stage a client calls in a secure step's session, as the protocol's spec reads.

:meth:`SecureStep.call <server.secure.step.SecureStep.call>` checks that a call belongs to the open session and
dispatches it here by its stage (:data:`HANDLERS`); each handler takes the step and the caller's authenticated
index and identity, and either records what the client sent (``None``, the step's state persisted) or answers
what it asks for (a :data:`Reply`, ``ready`` False while that is not fixed yet). Every check names the attack it
stops; a ``SecAggError`` raised here is the caller's refusal by the session (``FAILED_PRECONDITION``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from common.infra.faults import fault_point
from common.secagg.primitives import SecAggError
from common.secagg.rounds import Keys, key_fingerprints
from common.secagg.signed_messages import keys_message
from common.secagg.signing import certificate_identity
from server.checks import Refused
from server.secure.staging import fingerprint

if TYPE_CHECKING:
    from server.secure.step import SecureStep

Reply = dict[str, Any]


def _advertise(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
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
        _check_signed(step, index, client_id, keys)
    except SecAggError as err:
        raise Refused("INVALID_ARGUMENT", f"client {index}'s advertise is refused: {err}") from err
    current = step.session.keys.get(index)
    if current != keys and any(fingerprint(p) in step.seen for p in prints):
        # A copy of an earlier step's (or session's) advertise: taken, it would fill the client's slot with
        # keys whose private halves belong to a finished session, and refuse the client's own advertise.
        raise Refused(
            "INVALID_ARGUMENT",
            f"client {index}'s advertise is refused: a public key of an earlier secure session of this run "
            "(a replay; every session's keys are fresh)",
        )
    step.session.advertise(keys)  # distinct keys, the roster still open, one of the step's clients
    step.staging.record(step.session, "advertise", index)


def _check_signed(step: SecureStep, index: int, client_id: str, keys: Keys) -> None:
    """Signed mode: the advertise's signature covers this session's context, the index and the keys, and
    its certificate names the caller. The clients check the same of every roster entry (and the CA, which
    ``step.verifier`` checks here too when given); one bad entry makes each of them refuse the session, so
    a client's forged or replayed advertise must stop here."""
    if not step.signed:
        return
    if not keys.certificate or not keys.signature:
        raise SecAggError("the run is signed: an advertise carries the client's certificate and signature")
    k = keys
    identity = (step.verifier.identity if step.verifier else certificate_identity)(k.certificate)
    message = keys_message(step.session.context, index, identity, k.cipher_public, k.mask_public, k.commitment)
    step._check(k.certificate, message, k.signature)
    if identity != client_id:
        raise SecAggError(f"its certificate names client {identity!r}, but client {client_id!r} sent it")


def _roster(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
    s = step.session
    if s.roster is None:
        return _wait(step, f"{len(s.keys)}/{len(s.expected)} clients advertised keys")
    if index not in s.roster:
        raise SecAggError("the roster was fixed without this client")
    return {"ready": True, "roster": list(s.roster_for(index).values())}  # its neighbourhood's keys


def _share(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
    step.session.share(index, shares)  # one box of the protocol's size for each other roster client
    step.staging.record(step.session, "share", index)


def _inbox(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
    s = step.session
    if s.sharers is None:
        return _wait(step, f"{len(s.boxes)}/{len(s.roster or {})} clients shared keys")
    if index not in s.sharers:
        raise SecAggError("the share round closed without this client")
    return {"ready": True, "sharers": s.sharers, "shares": s.inbox(index)}


def _unmask(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
    if step.session.survivors is None:
        return _wait(step, "waiting for the masked inputs")
    survivors, dropped = step.session.close_inputs()
    return {"ready": True, "survivors": survivors, "dropped": dropped}


def _confirm(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
    if not step.signed:
        raise SecAggError("this run's secure aggregation is not signed: there is no consistency round")
    step.session.confirm(index, shares.get(index, b""))  # relayed; the clients verify the signatures
    step.staging.record(step.session, "confirm", index)


def _confirmations(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
    s = step.session
    if not s.confirmed(late=step.late(step.deadline_s())):
        return _wait(step, f"{len(s.confirmations)} survivors confirmed the unmask request")
    near = s.near(index)  # a client counts its neighbours' confirmations only: it is sent no others
    return {"ready": True, "shares": {j: c for j, c in s.confirmations.items() if near is None or j in near}}


def _reveal(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> None:
    step.session.reveal(index, shares)  # a survivor's answer: one share of the right size per client
    step.staging.record(step.session, "reveal", index)
    fault_point("secagg.revealed")


def _blame(step: SecureStep, index: int, client_id: str, keys: Keys | None, shares: dict[int, bytes]) -> Reply:
    """Signed mode: the proofs against the clients excluded from the step (client -> JSON), by which a client
    that answered an earlier session checks that the restart leaves out only clients proven to deviate."""
    if not step.signed:
        raise SecAggError("this run's secure aggregation is not signed: there is no blame to prove")
    return {"ready": True, "shares": {i: json.dumps(p, sort_keys=True).encode() for i, p in step.proofs.items()}}


def _wait(step: SecureStep, message: str) -> Reply:
    return {"ready": False, "retry_after_s": step.poll_s(), "message": message}


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
