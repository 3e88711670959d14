"""The coordinator: its state machine directly, and its gRPC service on loopback."""

from __future__ import annotations

import dataclasses
import time

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

import server.coordinator
import server.intake
import server.run
import server.secure.step
from client.transport import Backoff, CoordinatorClient, Rejected
from common.infra.tls import Security
from common.run.settings import SecAggSettings
from common.secagg.client_session import ClientSession
from common.secagg.terms import client_terms, context, fixed_point, masked_update, threshold
from common.wire.instructions import LoraStep
from common.wire.messages import ClientUpdate, ModelSpec, Phase, RoundPlan, Wait
from common.wire.tensors import FACTOR, GRAM, LORA, tensor_name
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.checks import Options, Refused
from server.coordinator import Coordinator
from server.secure.intake import SecureIntake
from server.service import create_server
from server.strategies import make_strategy

from unit_helpers import LORA_SPEC, unit_config
from updates import plan_update

SPEC = LORA_SPEC


config = unit_config


def update_for(plan: RoundPlan, index: int, seed: int = 0) -> ClientUpdate:
    g = torch.Generator().manual_seed(seed * 100 + index)
    trained = plan.expect(LoraStep).train_factors
    factors = {
        name: {f: torch.randn(*((d_out, 2) if f == "B" else (2, d_in)), generator=g) for f in trained}
        for name, (d_out, d_in) in SPEC.layers.items()
    }
    grams = {name: torch.rand(d_in, generator=g, dtype=torch.float64) + 0.1 for name, (_, d_in) in SPEC.layers.items()}
    x = torch.randn(12, 4, generator=g, dtype=torch.float64)
    head = plan.phase == Phase.TRAIN
    return plan_update(
        plan,
        index,
        10 + index,
        factors=factors,
        grams=grams,
        head_weight=torch.randn(6, 4, generator=g) if head else None,
        head_bias=torch.randn(6, generator=g) if head else None,
        head_gram=x.T @ x if head else None,
        train_loss=1.0,
    )


def started(tmp_path, **kw) -> Coordinator:
    coord = Coordinator(config(**kw.pop("cfg", {})), tmp_path / "state", Options(**kw))
    for i in range(3):
        assert coord.join(f"c{i}", i) == i
        coord.describe(f"c{i}", SPEC)
    return coord


def test_waits_for_every_client_then_runs(tmp_path):
    coord = Coordinator(config(), tmp_path / "state")
    assert coord.join("c0") == 0
    coord.describe("c0", SPEC)
    assert isinstance(coord.pull("c0"), Wait)
    assert coord.join("c1") == 1 and coord.join("c0") == 0  # joining again keeps the index
    with pytest.raises(Refused) as err:
        coord.join("c9", 1)
    assert err.value.code == "ALREADY_EXISTS"
    coord.join("c2")
    coord.describe("c1", SPEC)
    coord.describe("c2", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and (plan.task, plan.round, plan.phase) == (0, 0, Phase.TRAIN)
    with pytest.raises(Refused) as err:
        coord.describe("c1", ModelSpec(layers={"l1": (5, 4)}, feature_dim=4, num_classes=6))
    assert err.value.code == "INVALID_ARGUMENT" and "missing ['l2']" in str(err.value)


def test_duplicate_stale_and_impersonation(tmp_path):
    coord = started(tmp_path)
    plan = coord.pull("c0")
    assert coord.submit(update_for(plan, 0), "k0") is True
    assert coord.submit(update_for(plan, 0), "k0") is False  # duplicate: acknowledged, ignored
    assert isinstance(coord.pull("c0"), Wait)  # done with this step
    forged = update_for(plan, 1)
    forged.client_id = "c2"
    with pytest.raises(Refused) as err:
        coord.submit(forged, "k")
    assert err.value.code == "PERMISSION_DENIED"
    stale = update_for(plan, 1)
    stale.round = 1
    with pytest.raises(Refused) as err:
        coord.submit(stale, "k1")
    assert err.value.code == "FAILED_PRECONDITION"
    bad = update_for(plan, 1)
    bad.tensors[tensor_name(GRAM, "l1")] = torch.ones(7, dtype=torch.float64)
    with pytest.raises(Refused) as err:
        coord.submit(bad, "k1")
    assert err.value.code == "INVALID_ARGUMENT" and "gram/l1" in str(err.value)
    assert coord.status()["clients_done"] == 1  # nothing but client 0 was recorded


def test_deadline_with_quorum_closes_the_step_and_refuses_late_updates(tmp_path):
    coord = started(tmp_path, quorum=2, round_deadline_s=0.3)
    plan = coord.pull("c0")
    coord.submit(update_for(plan, 0), "k0")
    coord.submit(update_for(plan, 2), "k2")
    coord.tick()
    assert coord.status()["round"] == 0  # deadline not yet passed
    time.sleep(0.35)
    coord.tick()
    assert coord.status()["round"] == 1  # closed without client 1
    with pytest.raises(Refused) as err:
        coord.submit(update_for(plan, 1), "k1")
    assert err.value.code == "FAILED_PRECONDITION"
    nxt = coord.pull("c1")  # the late client rejoins at the next round
    assert isinstance(nxt, RoundPlan) and nxt.round == 1 and nxt.expect(LoraStep).train_factors == ("A",)


def test_a_push_naming_a_secure_session_on_a_step_without_one_is_refused(tmp_path):
    """secure_attempt was checked on secure steps only: a push of a plain step naming session 1 (or 2^31 - 1) was
    recorded. It is refused, at its envelope and at its submission, and nothing is recorded."""
    coord = started(tmp_path)
    plan = coord.pull("c0")
    for attempt in (1, 2**31 - 1):
        with pytest.raises(Refused) as err:
            coord.precheck("c0", 0, plan.run_id, plan.task, plan.round, plan.phase, "k", secure_attempt=attempt)
        assert err.value.code == "INVALID_ARGUMENT" and f"names secure session {attempt}" in str(err.value)
        with pytest.raises(Refused, match="names a secure session, but the step has none"):
            coord.submit(dataclasses.replace(update_for(plan, 0), secure_attempt=attempt), "k0")
    assert coord.status()["clients_done"] == 0
    assert coord.submit(update_for(plan, 0), "k0") is True


def test_out_of_order_arrivals_fold_in_index_order(tmp_path):
    """Arrival order does not change the merge: the fold is in client-index order."""
    results = []
    for order, name in (((0, 1, 2), "a"), ((2, 0, 1), "b")):
        coord = started(tmp_path / name)
        plan = coord.pull("c0")
        for i in order:
            coord.submit(update_for(plan, i), f"k{i}")
        results.append(coord.run.strategy.shared)
    for layer in SPEC.layers:
        assert torch.equal(results[0][layer].b, results[1][layer].b)


def test_restart_refolds_staged_submissions(tmp_path):
    coord = started(tmp_path)
    plan = coord.pull("c0")
    coord.submit(update_for(plan, 0), "k0")
    coord.submit(update_for(plan, 1), "k1")
    again = Coordinator(config(), tmp_path / "state")  # as after a crash: same state dir
    assert again.status()["clients_done"] == 2
    assert again.submit(update_for(plan, 1), "k1") is False  # still known: a duplicate
    again.submit(update_for(plan, 2), "k2")
    ref = started(tmp_path / "ref")
    for i in range(3):
        ref.submit(update_for(plan, i), f"k{i}")
    for layer in SPEC.layers:
        assert torch.equal(again.run.strategy.shared[layer].b, ref.run.strategy.shared[layer].b)


def test_other_configuration_on_same_state_dir_is_refused(tmp_path):
    started(tmp_path)
    with pytest.raises(ValueError, match="different configuration"):
        Coordinator(config(seed=2), tmp_path / "state")


@pytest.fixture
def served(tmp_path):
    coord = started(tmp_path)
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    yield coord, f"127.0.0.1:{port}"
    server.stop(0)


def test_grpc_push_duplicate_stale_malformed_and_health(served):
    coord, target = served
    client = CoordinatorClient(target, "c0", Backoff(give_up_s=5), security=Security(insecure=True))
    config_back, index = client.join(0)
    assert index == 0 and config_back == coord.config
    plan = client.pull()
    assert isinstance(plan, RoundPlan) and plan.expect(LoraStep).train_factors == ("B",)
    assert torch.equal(plan.low_rank(LORA)["l1"].a, coord.run.strategy.shared["l1"].a)  # byte-exact over the wire
    update = update_for(plan, 0)
    assert client.push(update, "key-0") is False
    assert client.push(update, "key-0") is True  # a retried push is acknowledged as a duplicate
    stale = update_for(plan, 0)
    stale.round = 1
    with pytest.raises(Rejected) as err:
        client.push(stale, "key-x")
    assert err.value.code == grpc.StatusCode.FAILED_PRECONDITION
    other = CoordinatorClient(target, "c1", Backoff(give_up_s=5), security=Security(insecure=True))
    other.join(1)
    bad = update_for(plan, 1)
    bad.tensors[tensor_name(FACTOR, "l2", "B")] = torch.ones(3, 3)
    with pytest.raises(Rejected) as err:
        other.push(bad, "key-1")
    assert err.value.code == grpc.StatusCode.INVALID_ARGUMENT and "factor/l2/B" in str(err.value)
    stranger = CoordinatorClient(target, "nobody", Backoff(give_up_s=5), security=Security(insecure=True))
    stranger.run_id = "unit"
    with pytest.raises(Rejected) as err:
        stranger.pull()
    assert err.value.code == grpc.StatusCode.PERMISSION_DENIED
    assert coord.status()["clients_done"] == 1
    with grpc.insecure_channel(target) as channel:
        reply = health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(service="lorm.v1.Coordinator"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING
    for c in (client, other, stranger):
        c.close()


@pytest.mark.parametrize("theirs", [0, codec.WIRE_VERSION + 1])
def test_grpc_join_of_another_wire_version_is_refused(served, theirs):
    """A client of another wire contract (a version-1 client names none: 0) is refused at its Join with
    FAILED_PRECONDITION naming both versions; the same client of this version is then let in."""
    _, target = served
    with grpc.insecure_channel(target) as channel:
        stub = pb_grpc.CoordinatorStub(channel)
        with pytest.raises(grpc.RpcError) as err:
            stub.Join(pb.JoinRequest(client_id="c0", wire_version=theirs), timeout=5)
        assert err.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        spoken = "version 1" if theirs == 0 else f"version {theirs}"
        assert spoken in err.value.details() and f"version {codec.WIRE_VERSION}" in err.value.details()
        reply = stub.Join(pb.JoinRequest(client_id="c0", wire_version=codec.WIRE_VERSION), timeout=5)
    assert reply.client_index == 0 and reply.wire_version == codec.WIRE_VERSION


def test_an_accepted_update_is_flattened_once(tmp_path, monkeypatch):
    """Validation and staging share one flat form of the update: the same dict of its tensors."""
    import common.aggregation.base
    import server.store

    seen: list[dict[str, torch.Tensor]] = []
    check, save = common.aggregation.base.check_tensors, server.store._save_tensors

    def checking(tensors, expected):
        seen.append(tensors)
        return check(tensors, expected)

    def saving(path, tensors):
        seen.append(tensors)
        return save(path, tensors)

    monkeypatch.setattr(common.aggregation.base, "check_tensors", checking)
    monkeypatch.setattr(server.store, "_save_tensors", saving)
    coord = started(tmp_path)
    plan = coord.pull("c0")
    seen.clear()
    update = update_for(plan, 0)
    assert coord.submit(update, "k0") is True
    assert len(seen) == 2 and seen[0] is seen[1]  # validated and staged: one object
    assert seen[0].keys() == update.tensors.keys()
    assert all(t is update.tensors[name] for name, t in seen[0].items())  # no tensor copied


class SteppedClock:
    """``time`` for the coordinator's modules with a ``monotonic`` the test moves (``advance``): a deadline test
    that does not depend on how fast a loaded machine runs the calls between two readings."""

    def __init__(self) -> None:
        self.now = 1000.0

    def monotonic(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    def __getattr__(self, name: str):
        return getattr(time, name)


def test_each_secure_round_gets_the_whole_deadline(tmp_path, monkeypatch):
    """A secure step's rounds each wait the deadline from when they opened. Had the share round been
    late from the step's start, it would close at the threshold as soon as three clients shared and
    leave out two that are alive; if the sharers then died before their input, the step would wait
    for ever with fewer than the threshold."""
    clock = SteppedClock()
    for module in (server.run, server.intake, server.secure.step):
        monkeypatch.setattr(module, "time", clock)
    n = 5
    cfg = {"num_clients": n, "num_tasks": 1, "settings": {"secagg": {"enabled": True}}}
    coord = Coordinator(config(**cfg), tmp_path / "state", Options(quorum=3, round_deadline_s=2.0))
    for i in range(n):
        assert coord.join(f"c{i}", i) == i
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan)
    ref = (plan.task, plan.round, plan.phase)
    t = threshold(SecAggSettings(enabled=True), n)
    sessions = [ClientSession(i, t, context(plan)) for i in range(n)]

    def call(i: int, stage: str, **kw) -> dict:
        return coord.secagg(f"c{i}", i, plan.run_id, ref, stage, **kw)

    clock.advance(1.2)
    for i in range(n):
        call(i, "advertise", keys=sessions[i].advertise())
    roster = call(0, "roster")["roster"]
    assert len(roster) == n
    clock.advance(1.2)  # the step began 2.4 s ago, past the deadline; the share round 1.2 s ago
    for i in range(3):
        call(i, "share", shares=sessions[i].share({k.index: k for k in roster}))
    coord.tick()
    assert not call(0, "inbox")["ready"]  # the share round opened now: it waits for the other two
    for i in (3, 4):
        call(i, "share", shares=sessions[i].share({k.index: k for k in roster}))
    assert call(0, "inbox")["sharers"] == list(range(n))
    assert not call(0, "unmask")["ready"]  # no masked input yet, and the inputs round is not late


def test_a_secure_round_stuck_below_the_threshold_restarts_with_the_clients_that_ask(tmp_path):
    """5 clients, threshold 3, deadline 1 s. All five share keys; clients 0 and 1 send their masked
    inputs, 2, 3 and 4 die. Past the deadline the inputs cannot close (2 < 3) and the step waits. When
    client 2 comes back without its keys (its advertise is refused), two answers and one client asking
    reach the threshold: the coordinator starts a fresh session (attempt 1), refuses the old one's calls
    with ABORTED, drops the abandoned masked inputs unread, and finishes on clients 0, 1 and 2."""
    n, t = 5, 3
    run = config(num_clients=n, num_tasks=1, settings={"secagg": {"enabled": True}})
    coord = Coordinator(run, tmp_path / "state", Options(quorum=3, round_deadline_s=1.0))
    for i in range(n):
        assert coord.join(f"c{i}", i) == i
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.secure_attempt == 0 and t == threshold(SecAggSettings(True), n)
    ref, fp, strategy = (
        (plan.task, plan.round, plan.phase),
        fixed_point(SecAggSettings(True), n),
        make_strategy(run, SPEC),
    )

    def call(i: int, stage: str, attempt: int = 0, **kw) -> dict:
        return coord.secagg(f"c{i}", i, plan.run_id, ref, stage, attempt=attempt, **kw)

    def session_of(members: list[int], step: RoundPlan) -> tuple[dict[int, ClientSession], list[int]]:
        """``members`` advertise and share in ``step``'s session (the roster as fixed); the sharers."""
        sessions = {i: ClientSession(i, t, context(step)) for i in members}
        for i in members:
            call(i, "advertise", step.secure_attempt, keys=sessions[i].advertise())
        roster = {k.index: k for k in call(members[0], "roster", step.secure_attempt)["roster"]}
        for i in members:
            call(i, "share", step.secure_attempt, shares=sessions[i].share(roster))
        return sessions, call(members[0], "inbox", step.secure_attempt)["sharers"]

    def push(i: int, step: RoundPlan, session: ClientSession, sharers: list[int]) -> None:
        u = update_for(step, i)
        masked = masked_update(u, client_terms(strategy.aggregator(step), u), session, sharers, fp, step.secure_attempt)
        assert coord.submit(masked, f"k{i}")

    sessions, sharers = session_of(list(range(n)), plan)
    assert sharers == list(range(n))
    for i in (0, 1):
        push(i, plan, sessions[i], sharers)
    time.sleep(1.2)
    coord.tick()
    step = coord.step
    assert (
        step is not None and isinstance(step.intake, SecureIntake) and step.intake.secure.attempt == 0
    )  # nobody asks: it waits
    assert isinstance(coord.pull("c2"), RoundPlan)  # client 2, restarted: a sharer, so it is sent the plan
    with pytest.raises(Refused) as refused:
        call(2, "advertise", keys=ClientSession(2, t, context(plan)).advertise())
    assert refused.value.code == "FAILED_PRECONDITION"  # the roster is fixed: it cannot take part again
    coord.tick()
    assert step.intake.secure.attempt == 1 and coord.store.staged_indices(step.key) == [] and not step.submitted
    # Killed at the restart (fault point secagg.restarted: the fresh session persisted, an abandoned input
    # still staged), the coordinator resumes in the fresh session and drops that input unread.
    u = update_for(plan, 0)
    stale = masked_update(u, client_terms(strategy.aggregator(plan), u), sessions[0], sharers, fp)
    coord.store.stage_update(step.key, stale, "k0")
    coord = Coordinator(run, tmp_path / "state", Options(quorum=3, round_deadline_s=1.0))
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake) and step.intake.secure.attempt == 1
    assert coord.store.staged_indices(step.key) == [] and not step.submitted
    with pytest.raises(Refused) as refused:
        call(0, "unmask")  # client 0 still waits in the abandoned session
    assert refused.value.code == "ABORTED"
    fresh = coord.pull("c0")
    assert isinstance(fresh, RoundPlan) and fresh.secure_attempt == 1 and context(fresh) != context(plan)
    with pytest.raises(Refused):  # the abandoned session's keys are no roster's any more
        push(1, plan, sessions[1], sharers)
    # 3 and 4 stay dead: the fresh keys round closes with three past its deadline, twice the step's (a session that
    # failed because its rounds closed on clients still computing would fail alike at the same deadline)
    new = {i: ClientSession(i, t, context(fresh)) for i in (0, 1, 2)}
    for i in new:
        call(i, "advertise", 1, keys=new[i].advertise())
    time.sleep(1.2)
    assert not call(0, "roster", 1)["ready"]  # past the step's 1 s, not the fresh session's 2 s
    time.sleep(1.0)
    roster = {k.index: k for k in call(0, "roster", 1)["roster"]}
    for i in new:
        call(i, "share", 1, shares=new[i].share(roster))
    sharers = call(0, "inbox", 1)["sharers"]
    assert sharers == [0, 1, 2]
    for i in new:
        push(i, fresh, new[i], sharers)
    request = call(0, "unmask", 1)
    assert request["survivors"] == [0, 1, 2] and request["dropped"] == []
    for i in new:
        inbox = call(i, "inbox", 1)["shares"]
        call(i, "reveal", 1, shares=new[i].reveal(inbox, request["survivors"], request["dropped"]))
    entry = coord.run.history[0]["secagg"]
    assert entry["attempt"] == 1 and entry["survivors"] == 3 and entry["samples"] == 10 + 11 + 12
    assert entry["bytes_received"]["masked"] > 0 and coord.step is not step  # the step finished


def test_a_step_no_client_holds_data_of_ends_unmerged_and_the_coordinator_goes_on(tmp_path):
    """Clients on their own data, none of it the task's: a training round ends without a merge (the last merged
    state kept), the task's Gram step, whose merge the steps after it need, ends the run ``failed`` naming why;
    the coordinator never raises out of a submit nor retries the merge forever."""
    owned = {"data": {"owned": True, "classes": ["a", "b", "c", "d", "e", "f"]}}
    coord = started(tmp_path, cfg={"dataset": "textfile", "settings": owned})
    before = {layer: ab.b.clone() for layer, ab in coord.run.strategy.shared.items()}
    for step in range(3):  # two training rounds, then the task's Gram step
        plan = coord.pull("c0")
        assert isinstance(plan, RoundPlan) and plan.task == 0
        for i in range(3):
            coord.submit(dataclasses.replace(update_for(plan, i), num_samples=0), f"k{step}-{i}")
    entries = coord.run.history
    assert [e["phase"] for e in entries] == ["train", "train", "task_gram"]
    assert all("no sample of the task's classes [0, 3)" in e["empty"] for e in entries)
    assert all(torch.equal(before[layer], ab.b) for layer, ab in coord.run.strategy.shared.items())
    assert coord.run.state.value == "failed"
    assert coord.pull("c0").phase == Phase.DONE  # told the run is over
