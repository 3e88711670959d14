"""A stream's peer sets its pace, within bounds: a Push that trickles a few bytes at a
time, never idle long enough for the idle bound, is cancelled once it is too slow, which frees its
call slot; a real gRPC server on loopback, every wait bounded."""

from __future__ import annotations

import threading
import time

import grpc
import pytest

from common.infra.tls import Security
from common.wire.messages import RoundPlan
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.admission import Limits
from server.coordinator import Coordinator
from server.service import create_server

from unit_helpers import LORA_SPEC, unit_config, valid_update

TRICKLE = {"grace_s": 1.0, "min_rate": 1024.0}  # after 1 s of waiting on the peer: 1 KiB per second waited


def test_a_trickling_push_loses_its_slot_and_an_honest_push_still_lands(tmp_path):
    """A Push that sends a 30-byte message every 0.2 s is never idle for ``idle_s``, so the
    idle bound alone lets it keep its call slot for as long as it trickles. Past ``grace_s`` of waiting
    on it, below ``min_rate`` bytes per second waited, it is cancelled: its slot (the caller's only one
    here) is free again, nothing of it was recorded, and the same update sent at once is accepted."""
    coord = Coordinator(unit_config(run_id="trickle"), tmp_path / "state")
    for i in range(3):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", LORA_SPEC)
    plan = coord.pull("c1")
    assert isinstance(plan, RoundPlan) and coord.step is not None and coord.step.aggregator is not None
    update = valid_update(plan, coord.step.aggregator.expected(), 1, seed=1)
    stream = list(codec.update_to_proto(update, "k1", chunk_bytes=4))
    assert len(stream) > 60  # 12 s of trickling at least: far past the bound, never idle
    limits = Limits(per_client=1, idle_s=5.0, **TRICKLE)
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True), limits=limits)
    server.start()
    channel = grpc.insecure_channel(f"127.0.0.1:{port}")  # one connection: one caller (nobody is authenticated)
    stub = pb_grpc.CoordinatorStub(channel)
    stop = threading.Event()

    def trickle():
        for message in stream:
            yield message
            if stop.wait(0.2):
                return

    try:
        start = time.monotonic()
        push = stub.Push.future(trickle(), timeout=30)
        time.sleep(0.5)
        with pytest.raises(grpc.RpcError) as busy:  # the trickle holds the caller's one slot
            stub.Status(pb.StatusRequest(), timeout=5)
        assert busy.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        cut = push.exception(timeout=20)
        took = time.monotonic() - start
        assert cut is not None and cut.code() == grpc.StatusCode.CANCELLED, cut
        assert took < 5.0, f"the trickle should be cut soon after the 1 s grace, but it held its slot {took:.1f} s"
        assert stub.Status(pb.StatusRequest(), timeout=5).run_id == "trickle"  # the slot is free again
        assert 1 not in coord.step.submitted
        reply = stub.Push(iter(stream), timeout=30)  # the honest pace: accepted
        assert reply.accepted and not reply.duplicate and 1 in coord.step.submitted
    finally:
        stop.set()
        channel.close()
        server.stop(0)


def test_slow_stream_limits_are_checked():
    with pytest.raises(ValueError, match="min_rate"):
        Limits(min_rate=-1.0)
    with pytest.raises(ValueError, match="grace_s"):
        Limits(grace_s=float("nan"))
