"""The wire format of secure aggregation: a client's ``SecAgg`` call and the coordinator's answer.

One request per stage of the protocol (``SECAGG_STAGES``, in ``SecAggStage`` order: the client's keys at
``advertise``, its sealed boxes at ``share``, its shares at ``reveal``), one reply carrying what the stage
hands back (the roster, the boxes sealed for the caller, the survivors and the dropped). The decoder
bounds what a client sends before the coordinator reads it: two 32-byte public keys and a 32-byte
commitment at ``advertise``, a certificate and a signature of bounded size. The envelopes are in
:mod:`proto.codec`; the phase and the field checks in :mod:`proto.fields`."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from common.secagg.rounds import Keys
from common.wire.messages import Phase
from common.wire.tensors import WireError
from proto import lorm_pb2 as pb
from proto.fields import non_empty, non_negative, phase_from_proto, phase_to_proto

# SecAggStage 1..8
SECAGG_STAGES = ("advertise", "roster", "share", "inbox", "unmask", "reveal", "confirm", "confirmations", "blame")
MAX_CERTIFICATE_BYTES = 16 * 1024
MAX_SIGNATURE_BYTES = 512


def secagg_request_to_proto(
    run_id: str,
    client_id: str,
    client_index: int,
    step: tuple[int, int, Phase],
    stage: str,
    keys: Keys | None = None,
    shares: Mapping[int, bytes] | None = None,
    attempt: int = 0,
) -> pb.SecAggRequest:
    task, round_, phase = step
    return pb.SecAggRequest(
        run_id=run_id,
        client_id=client_id,
        client_index=client_index,
        step=pb.StepRef(task=task, round=round_, phase=phase_to_proto(phase)),
        stage=pb.SecAggStage.Value(f"SECAGG_{stage.upper()}"),
        keys=None if keys is None else _keys_to_proto(keys),
        shares=[pb.SecAggShare(peer=j, data=d) for j, d in sorted((shares or {}).items())],
        attempt=attempt,
    )


def secagg_request_from_proto(msg: pb.SecAggRequest) -> dict[str, Any]:
    """The request's fields as :meth:`server.coordinator.Coordinator.secagg` takes them."""
    if not 1 <= msg.stage <= len(SECAGG_STAGES):
        raise WireError("stage", f"expected a secure aggregation stage 1..{len(SECAGG_STAGES)}, got {msg.stage}")
    non_empty(run_id=msg.run_id, client_id=msg.client_id)
    stage = SECAGG_STAGES[msg.stage - 1]
    if stage == "advertise" and (len(msg.keys.cipher_public) != 32 or len(msg.keys.mask_public) != 32):
        raise WireError("keys", "an advertise carries two 32-byte X25519 public keys")
    if stage == "advertise" and len(msg.keys.commitment) != 32:
        raise WireError("keys", "an advertise carries a 32-byte commitment to the client's own-mask seed")
    if len(msg.keys.certificate) > MAX_CERTIFICATE_BYTES or len(msg.keys.signature) > MAX_SIGNATURE_BYTES:
        raise WireError(
            "keys",
            f"a certificate of at most {MAX_CERTIFICATE_BYTES} bytes and a signature of at most {MAX_SIGNATURE_BYTES}",
        )
    return {
        "client_id": msg.client_id,
        "client_index": msg.client_index,
        "run_id": msg.run_id,
        "step_ref": (msg.step.task, msg.step.round, phase_from_proto(msg.step.phase, "step.phase")),
        "stage": stage,
        "keys": _keys_from_proto(msg.keys) if stage == "advertise" else None,
        "shares": {s.peer: bytes(s.data) for s in msg.shares},
        "attempt": _checked_attempt(msg.attempt),
    }


def _checked_attempt(attempt: int) -> int:
    non_negative(attempt=attempt)
    return attempt


def secagg_reply_to_proto(reply: Mapping[str, Any]) -> pb.SecAggReply:
    return pb.SecAggReply(
        ready=reply["ready"],
        retry_after_s=reply.get("retry_after_s", 0.0),
        message=reply.get("message", ""),
        roster=[_keys_to_proto(k) for k in reply.get("roster", [])],
        sharers=reply.get("sharers", []),
        shares=[pb.SecAggShare(peer=j, data=d) for j, d in sorted(reply.get("shares", {}).items())],
        survivors=reply.get("survivors", []),
        dropped=reply.get("dropped", []),
    )


def secagg_reply_from_proto(msg: pb.SecAggReply) -> dict[str, Any]:
    return {
        "ready": msg.ready,
        "retry_after_s": msg.retry_after_s,
        "message": msg.message,
        "roster": {k.index: _keys_from_proto(k) for k in msg.roster},
        "sharers": list(msg.sharers),
        "shares": {s.peer: bytes(s.data) for s in msg.shares},
        "survivors": list(msg.survivors),
        "dropped": list(msg.dropped),
    }


def _keys_to_proto(keys: Keys) -> pb.SecAggKeys:
    return pb.SecAggKeys(
        index=keys.index,
        cipher_public=keys.cipher_public,
        mask_public=keys.mask_public,
        commitment=keys.commitment,
        certificate=keys.certificate,
        signature=keys.signature,
    )


def _keys_from_proto(msg: pb.SecAggKeys) -> Keys:
    return Keys(
        msg.index,
        bytes(msg.cipher_public),
        bytes(msg.mask_public),
        bytes(msg.commitment),
        bytes(msg.certificate),
        bytes(msg.signature),
    )
