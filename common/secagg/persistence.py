"""Secure aggregation's session state: what the coordinator persists of a step's session, and the session
back from it (:func:`session_state`, :func:`session_from_state`).

JSON with bytes as hex, written with the secure step's state (``server/secure/step.py``). The masked total
is left out: on resume the coordinator adds the staged masked inputs of the survivors again. The session
itself is ``server_session.py``'s.
"""

from __future__ import annotations

from common.secagg.rounds import Keys
from common.secagg.server_session import ServerSession


def session_state(session: ServerSession) -> dict:
    """What the coordinator persists of a step's session (JSON; bytes as hex): everything but the
    masked total, which it rebuilds from the staged masked inputs of the survivors."""
    return {
        "expected": session.expected,
        "threshold": session.threshold,
        "context": session.context.hex(),
        "keys": {
            str(i): [
                k.cipher_public.hex(),
                k.mask_public.hex(),
                k.commitment.hex(),
                k.certificate.hex(),
                k.signature.hex(),
            ]
            for i, k in session.keys.items()
        },
        "roster": None if session.roster is None else sorted(session.roster),
        "boxes": {str(i): {str(j): b.hex() for j, b in boxes.items()} for i, boxes in session.boxes.items()},
        "sharers": session.sharers,
        "survivors": session.survivors,  # U3 once fixed; the inputs are then added again on resume
        "revealed": {str(i): {str(j): s.hex() for j, s in shares.items()} for i, shares in session.revealed.items()},
        "confirmations": {str(i): sig.hex() for i, sig in session.confirmations.items()},
        "received": session.received,
        "signed": session.signed,
    }


def session_from_state(state: dict) -> ServerSession:
    """Inverse of :func:`session_state`, before the inputs are added again (``inputs`` empty)."""
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
    )
