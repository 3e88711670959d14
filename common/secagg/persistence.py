"""Secure aggregation's session state: what the coordinator persists of a step's session, and the session
back from it (:func:`session_state`, :func:`session_from_state`).

JSON with bytes as hex, written with the secure step's state (``server/secure/step.py``). The masked total
is left out: on resume the coordinator adds the staged masked inputs of the survivors again. The session
itself is ``server_session.py``'s.
"""

from __future__ import annotations

from common.secagg.graph import Graph
from common.secagg.rounds import Keys
from common.secagg.server_session import ServerSession


def session_state(session: ServerSession) -> dict:
    """What the coordinator persists of a step's session (JSON; bytes as hex): everything but the
    masked total, which it rebuilds from the staged masked inputs of the survivors."""
    return {
        "expected": session.expected,
        "threshold": session.threshold,
        "context": session.context.hex(),
        "keys": {str(i): session_state_of(session, "keys", i) for i in session.keys},
        "roster": None if session.roster is None else sorted(session.roster),
        "boxes": {str(i): session_state_of(session, "boxes", i) for i in session.boxes},
        "sharers": session.sharers,
        "survivors": session.survivors,  # U3 once fixed; the inputs are then added again on resume
        "revealed": {str(i): session_state_of(session, "revealed", i) for i in session.revealed},
        "confirmations": {str(i): session_state_of(session, "confirmations", i) for i in session.confirmations},
        "received": session.received,
        "signed": session.signed,
    }


RECORDED = {"advertise": "keys", "share": "boxes", "confirm": "confirmations", "reveal": "revealed"}


def session_record(session: ServerSession, stage: str, index: int) -> dict:
    """What client ``index``'s call of ``stage`` added to ``session``, as a record :func:`apply_record` replays onto
    the session's state: the same JSON as :func:`session_state` holds for it, and the bytes received so far."""
    field = RECORDED[stage]
    value = session_state_of(session, field, index)
    return {"field": field, "index": str(index), "value": value, "received": dict(session.received)}


def apply_record(state: dict, record: dict) -> None:
    """Replay ``record`` (:func:`session_record`) onto a session's ``state`` (:func:`session_state`): it sets what
    the call set, so a record replayed twice changes nothing."""
    state[record["field"]][record["index"]] = record["value"]
    state["received"] = dict(record["received"])


def session_state_of(session: ServerSession, field: str, index: int) -> object:
    """One client's entry of :func:`session_state`'s ``field``."""
    if field == "keys":
        k = session.keys[index]
        return [k.cipher_public.hex(), k.mask_public.hex(), k.commitment.hex(), k.certificate.hex(), k.signature.hex()]
    if field == "boxes":
        return {str(j): b.hex() for j, b in session.boxes[index].items()}
    if field == "confirmations":
        return session.confirmations[index].hex()
    return {str(j): s.hex() for j, s in session.revealed[index].items()}


def session_from_state(state: dict, graph: Graph | None = None) -> ServerSession:
    """Inverse of :func:`session_state`, before the inputs are added again (``inputs`` empty); ``graph``: the
    session's, drawn again from its context (``common.secagg.terms.step_graph``)."""
    keys = {int(i): Keys(int(i), *(bytes.fromhex(v) for v in fields)) for i, fields in state["keys"].items()}
    return ServerSession(
        expected=list(state["expected"]),
        threshold=int(state["threshold"]),
        context=bytes.fromhex(state["context"]),
        keys=keys,
        roster=None if state["roster"] is None else {i: keys[i] for i in state["roster"]},
        boxes={int(i): {int(j): bytes.fromhex(b) for j, b in bx.items()} for i, bx in state["boxes"].items()},
        sharers=state["sharers"],
        revealed={int(i): {int(j): bytes.fromhex(s) for j, s in sh.items()} for i, sh in state["revealed"].items()},
        confirmations={int(i): bytes.fromhex(sig) for i, sig in state.get("confirmations", {}).items()},
        received=dict(state["received"]),
        signed=bool(state.get("signed", False)),
        graph=graph,
    )
