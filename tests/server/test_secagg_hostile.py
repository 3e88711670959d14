"""Secure aggregation against a hostile client: each test is an attack on the coordinator's
secure rounds, driven through ``Coordinator`` directly, and what must hold after it.

Finding ids in the names: H1 (a client takes another's slot), H2 (one failure halts the run), M1 (the
first pusher fixes the layout; oversized headers), L1 (share box sizes), L2 (block Grams unchecked),
L3 (pushes carry the session), L4 (copied keys; an opened box's length)."""

from __future__ import annotations

import dataclasses
import types

import pytest
import torch
from test_coordinator import SPEC, config, update_for

from common.aggregation.validate import UpdateRejected
from common.merges.sums import running_sums
from common.run.settings import SecAggSettings
from common.secagg.boxes import seal
from common.secagg.client_session import ClientSession
from common.secagg.primitives import SecAggError
from common.secagg.rounds import BOX_BYTES, Keys
from common.secagg.terms import client_terms, context, fixed_point, masked_update, threshold
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from common.wire.tensors import MASKED
from server import coordinator as coordinator_module
from server.checks import Options, Refused
from server.coordinator import Coordinator, State
from server.secure import check_sums
from server.secure import stages as secure_stages_module
from server.secure.intake import SecureIntake
from server.strategies import make_strategy

N = 5
SETTINGS = SecAggSettings(enabled=True)


def secure_run(tmp_path, rounds: int = 2, **secagg) -> tuple[Coordinator, RoundPlan]:
    run = config(num_clients=N, num_tasks=1, rounds_per_task=rounds, settings={"secagg": {"enabled": True, **secagg}})
    coord = Coordinator(run, tmp_path / "state", Options())
    for i in range(N):
        assert coord.join(f"c{i}", i) == i
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.phase == Phase.TRAIN
    return coord, plan


class Party:
    """Client ``i``'s side of one session of the open step, calling the coordinator directly."""

    def __init__(self, coord: Coordinator, i: int, plan: RoundPlan) -> None:
        self.coord, self.i, self.plan = coord, i, plan
        self.session = ClientSession(i, threshold(SETTINGS, N), context(plan))
        self.strategy = make_strategy(coord.config, SPEC)

    def call(self, stage: str, **kw) -> dict:
        ref = (self.plan.task, self.plan.round, self.plan.phase)
        return self.coord.secagg(
            f"c{self.i}", self.i, self.plan.run_id, ref, stage, attempt=self.plan.secure_attempt, **kw
        )

    def update(self) -> ClientUpdate:
        return update_for(self.plan, self.i)

    def masked(self, sharers: list[int]) -> ClientUpdate:
        u = self.update()
        terms = client_terms(self.strategy.aggregator(self.plan), u)
        return masked_update(u, terms, self.session, sharers, fixed_point(SETTINGS, N), self.plan.secure_attempt)


def keys_and_shares(parties: list[Party]) -> list[int]:
    for p in parties:
        p.call("advertise", keys=p.session.advertise())
    roster = {k.index: k for k in parties[0].call("roster")["roster"]}
    for p in parties:
        p.call("share", shares=p.session.share(roster))
    return parties[0].call("inbox")["sharers"]


def session(coord: Coordinator, members: list[int], garbage: int | None = None, liar: int | None = None) -> None:
    """One whole session of the open step among ``members``: client ``garbage`` pushes random ring
    elements in the step's layout, client ``liar`` answers the unmask request with flipped shares."""
    plan = coord.pull(f"c{members[0]}")
    assert isinstance(plan, RoundPlan)
    parties = [Party(coord, i, plan) for i in members]
    sharers = keys_and_shares(parties)
    for p in parties:
        masked = p.masked(sharers)
        if p.i == garbage:
            g = torch.Generator().manual_seed(p.i)
            noise = {n: torch.randint(-(2**62), 2**62, t.shape, generator=g) for n, t in masked.tensors.items()}
            masked = dataclasses.replace(masked, tensors=noise)
        assert coord.submit(masked, f"k{p.i}-{plan.secure_attempt}")
    request = parties[0].call("unmask")
    for p in parties:
        inbox = p.call("inbox")["shares"]
        answer = p.session.reveal(inbox, request["survivors"], request["dropped"])
        if p.i == liar:
            answer = {j: bytes(b ^ 0x5A for b in s) for j, s in answer.items()}
        p.call("reveal", shares=answer)


def plain_sums(coord: Coordinator, plan: RoundPlan, members: list[int]) -> dict[str, torch.Tensor]:
    agg = make_strategy(coord.config, SPEC).aggregator(plan)
    for i in members:
        agg.fold(update_for(plan, i))
    return running_sums(agg)


def test_h1_a_client_cannot_advertise_keys_for_another_clients_slot(tmp_path):
    """Client 3 advertises keys under index 4 before client 4 does: refused as the caller is not 4; client 4
    then takes part, and every client's slot holds its own keys."""
    coord, plan = secure_run(tmp_path)
    three = Party(coord, 3, plan)
    forged = dataclasses.replace(three.session.advertise(), index=4)
    with pytest.raises(Refused) as refused:
        three.call("advertise", keys=forged)
    assert refused.value.code == "PERMISSION_DENIED"
    parties = [Party(coord, i, plan) for i in range(N)]
    assert keys_and_shares(parties) == list(range(N))
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake)
    assert all(step.intake.secure.session.keys[i] == parties[i].session.keys for i in range(N))


def test_h2_a_wrong_share_names_its_sender_who_is_left_out_and_the_step_finishes(tmp_path):
    """Client 0 answers the unmask request with wrong shares. Its seed commitment and the spare answers
    show whose shares are wrong: client 0 is named and excluded, a fresh session (attempt 1) runs among
    clients 1..4, and the step merges exactly their sum. The run goes on."""
    coord, plan = secure_run(tmp_path)
    session(coord, list(range(N)), liar=0)
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake) and coord.run.state == State.RUNNING
    assert step.intake.secure.attempt == 1 and list(step.intake.secure.excluded) == [0]
    assert "revealed a wrong share" in step.intake.secure.excluded[0]
    assert not coord.run.history
    fresh = coord.pull("c0")
    assert isinstance(fresh, coordinator_module.Wait)  # client 0 is out of this step's sessions
    session(coord, [1, 2, 3, 4])
    entry = coord.run.history[0]
    assert entry["secagg"]["attempt"] == 1 and entry["secagg"]["survivors"] == 4
    assert entry["secagg"]["samples"] == sum(10 + i for i in range(1, N))
    merged = make_strategy(coord.config, SPEC)
    fold = merged.fold(plan)
    agg = fold.aggregator
    for i in range(1, N):
        agg.fold(update_for(plan, i))
    fold.finish()
    have = coord.run.strategy.state_tensors()
    for name, want in merged.state_tensors().items():  # float64 rounding of the fixed point, through the solves
        assert torch.allclose(have[name].double(), want.double(), rtol=1e-9, atol=1e-12), name


def test_h2_a_wrong_share_from_the_last_answerer_is_named_too(tmp_path):
    """Client 4, ranked past the threshold (3), answers with wrong shares. Rebuilding from the first three
    answers alone would pass over it (their secret checks out) and the liar would go unnamed, as it would not
    had its index been lower; the last three answers are checked too. Client 4 is named and excluded, and the
    history of the step's restarted session records the failure and the culprit."""
    coord, plan = secure_run(tmp_path)
    session(coord, list(range(N)), liar=N - 1)
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake) and step.intake.secure.attempt == 1
    assert list(step.intake.secure.excluded) == [N - 1] and not coord.run.history
    session(coord, list(range(N - 1)))
    record = coord.run.history[0]["secagg"]
    assert record["attempt"] == 1 and record["survivors"] == N - 1 and record["dropped"] == []
    assert list(record["excluded"]) == [str(N - 1)] and "revealed a wrong share" in record["excluded"][str(N - 1)]
    assert len(record["failed"]) == 1 and "Culprits" in record["failed"][0]


def test_h2_a_garbage_input_restarts_the_session_then_ends_the_round_unmerged(tmp_path):
    """Client 0 masks random ring elements in the step's layout: the unmasked sum is out of the fixed
    point's range, and nobody can be named (the coordinator sees sums only). The session restarts with
    fresh keys; after ``max_attempts`` (2) failed sessions the training round ends without a merge, recorded
    in the history, and the next step opens. Nothing raises; ``tick`` keeps working."""
    coord, plan = secure_run(tmp_path, max_attempts=2)
    before = {k: v.clone() for k, v in coord.run.strategy.state_tensors().items()}
    session(coord, list(range(N)), garbage=0)
    step = coord.step
    assert (
        step is not None
        and isinstance(step.intake, SecureIntake)
        and step.intake.secure.attempt == 1
        and not step.intake.secure.excluded
    )
    session(coord, list(range(N)), garbage=0)
    coord.tick()
    entry = coord.run.history[0]
    assert entry["clients"] == 0 and len(entry["secagg"]["failed"]) == 2
    assert "SecAggError" in entry["secagg"]["failed"][0]
    assert coord.step is not None and coord.step.index == 1 and coord.run.state == State.RUNNING
    after = coord.run.strategy.state_tensors()
    assert all(torch.equal(before[k], after[k]) for k in before)  # the round merged nothing
    resumed = Coordinator(coord.config, tmp_path / "state", Options())
    assert resumed.run.history == coord.run.history and resumed.run.pointer == coord.run.pointer


def test_h2_a_gram_step_that_fails_past_its_attempts_ends_the_run_failed_not_wedged(tmp_path):
    """LoRM's task Gram is needed by every later merge: when its secure sum fails ``max_attempts`` (1) times,
    the run ends in state ``failed``, recorded; clients pulling are told it is over; a restart stays over."""
    coord, plan = secure_run(tmp_path, rounds=1, max_attempts=1)
    session(coord, list(range(N)))  # the training round merges
    gram = coord.pull("c0")
    assert isinstance(gram, RoundPlan) and gram.phase == Phase.TASK_GRAM
    session(coord, list(range(N)), garbage=3)
    assert coord.run.state == State.FAILED and coord.done.is_set() and coord.step is None
    assert coord.run.history[-1]["phase"] == Phase.TASK_GRAM.value and coord.run.history[-1]["secagg"]["failed"]
    for i in range(N):
        over = coord.pull(f"c{i}")
        assert isinstance(over, RoundPlan) and over.phase == Phase.DONE
    assert coord.all_clients_released()
    coord.tick()
    resumed = Coordinator(coord.config, tmp_path / "state", Options())
    assert resumed.run.state == State.FAILED and resumed.done.is_set()


def test_h2_a_restarted_coordinator_resumes_a_step_whose_sum_fails(tmp_path, monkeypatch):
    """Killed right after the last unmask answer is persisted (before the step finished), with a wrong share
    in it: the restarted coordinator refolds the staged inputs and answers, finds the liar and restarts the
    session, instead of failing at start-up."""
    coord, plan = secure_run(tmp_path)

    class Killed(Exception):
        pass

    answered = []

    def crash_on_last_reveal(name: str) -> None:
        if name == "secagg.revealed":
            answered.append(1)
            if len(answered) == N:
                raise Killed

    monkeypatch.setattr(secure_stages_module, "fault_point", crash_on_last_reveal)
    with pytest.raises(Killed):
        session(coord, list(range(N)), liar=2)
    monkeypatch.undo()
    resumed = Coordinator(coord.config, tmp_path / "state", Options())
    step = resumed.step
    assert step is not None and isinstance(step.intake, SecureIntake) and resumed.run.state == State.RUNNING
    assert step.intake.secure.attempt == 1 and list(step.intake.secure.excluded) == [2]
    session(resumed, [0, 1, 3, 4])
    assert resumed.run.history[0]["secagg"]["survivors"] == 4


def test_m1_the_first_pusher_cannot_fix_the_steps_layout(tmp_path):
    """Client 0 pushes first, masked sums of another layout: refused from its headers; the honest clients'
    inputs in the step's declared layout are then accepted."""
    coord, plan = secure_run(tmp_path)
    parties = [Party(coord, i, plan) for i in range(N)]
    sharers = keys_and_shares(parties)
    bogus = {f"{MASKED}/bogus": ("int64", (7, 2))}
    with pytest.raises(Refused) as refused:
        coord.precheck(
            "c0", 0, plan.run_id, plan.task, plan.round, plan.phase, "k0", declared=bogus, declared_bytes=112
        )
    assert refused.value.code == "INVALID_ARGUMENT"
    honest = parties[0].masked(sharers)
    odd = dataclasses.replace(honest, tensors={f"{MASKED}/bogus": torch.zeros(7, 2, dtype=torch.int64)})
    with pytest.raises(Refused):
        coord.submit(odd, "k0")
    for p in parties[1:]:
        assert coord.submit(p.masked(sharers), f"k{p.i}")


def test_m1_an_oversized_masked_header_is_refused_before_any_byte(tmp_path):
    coord, plan = secure_run(tmp_path)
    keys_and_shares([Party(coord, i, plan) for i in range(N)])
    huge = {f"{MASKED}/layers/l1/numerator": ("int64", (2**27, 2))}
    with pytest.raises(Refused, match="masked"):
        coord.precheck(
            "c1", 1, plan.run_id, plan.task, plan.round, plan.phase, "k1", declared=huge, declared_bytes=2**31
        )


def test_l1_share_boxes_of_another_size_are_refused(tmp_path):
    coord, plan = secure_run(tmp_path)
    parties = [Party(coord, i, plan) for i in range(N)]
    for p in parties:
        p.call("advertise", keys=p.session.advertise())
    roster = {k.index: k for k in parties[0].call("roster")["roster"]}
    boxes = parties[0].session.share(roster)
    assert {len(b) for b in boxes.values()} == {BOX_BYTES}
    with pytest.raises(Refused, match=f"{BOX_BYTES} bytes"):
        parties[0].call("share", shares={j: b * 1000 for j, b in boxes.items()})
    parties[0].call("share", shares=boxes)  # its right-sized boxes are then taken


def test_l2_a_block_grams_unmasked_sum_is_checked():
    """``ridge.blocks`` sums its Gram as (K, d, d) diagonal blocks: a block that is not positive
    semidefinite is refused, as a whole Gram is."""
    blocks = torch.eye(3, dtype=torch.float64).repeat(2, 1, 1)
    blocks[1, 0, 0] = -5.0
    holder = types.SimpleNamespace(num_samples=10)
    with pytest.raises(UpdateRejected, match="block 1"):
        check_sums(holder, {"head/sums/grams/gram/total": blocks}, clients=2)
    blocks[1, 0, 0] = 1.0
    check_sums(holder, {"head/sums/grams/gram/total": blocks}, clients=2)


def test_l3_a_masked_push_names_its_session_and_an_abandoned_ones_is_refused(tmp_path):
    """A push masked for attempt 0 after the step restarted (attempt 1) is refused with ABORTED, from its
    envelope (before its tensors) and at submission."""
    coord, plan = secure_run(tmp_path)
    session(coord, list(range(N)), liar=0)  # attempt 0 fails on client 0's shares: attempt 1 opens
    stale = Party(coord, 1, plan)
    with pytest.raises(Refused) as refused:
        coord.precheck("c1", 1, plan.run_id, plan.task, plan.round, plan.phase, "k", secure_attempt=0)
    assert refused.value.code == "ABORTED"
    stale.session.sharers = [1, 2, 3, 4]
    stale.session.roster = {}
    u = stale.update()
    masked = dataclasses.replace(u, tensors={f"{MASKED}/x": torch.zeros(1, 2, dtype=torch.int64)}, secure_attempt=0)
    with pytest.raises(Refused) as refused:
        coord.submit(masked, "k")
    assert refused.value.code == "ABORTED"


def test_l4_a_copied_public_key_is_refused(tmp_path):
    """Client 1 advertises client 0's cipher key as its own: refused (it could then open what is sealed for 0's
    key pair's peer, or mark a coordinator relaying one client twice); client 1's own keys are then taken."""
    coord, plan = secure_run(tmp_path)
    zero, one = Party(coord, 0, plan), Party(coord, 1, plan)
    zero.call("advertise", keys=zero.session.advertise())
    copied = dataclasses.replace(one.session.advertise(), cipher_public=zero.session.keys.cipher_public)
    with pytest.raises(Refused, match="same public key"):
        one.call("advertise", keys=copied)
    one.call("advertise", keys=one.session.advertise())


def test_l4_a_client_refuses_a_roster_with_a_repeated_key_and_a_box_of_the_wrong_length():
    ctx = b"run|0|0|train"
    a, b, c = (ClientSession(i, 2, ctx) for i in range(3))
    roster = {0: a.keys, 1: b.keys, 2: dataclasses.replace(c.keys, mask_public=b.keys.mask_public)}
    with pytest.raises(SecAggError, match="same public key"):
        a.share(roster)
    roster = {0: a.keys, 1: b.keys, 2: c.keys}
    a.share(roster)
    b.share(roster)
    a.sharers = [0, 1, 2]
    short = seal(b.cipher_private, a.keys.cipher_public, 1, 0, b"\x00" * 20, ctx)  # authentic, but 20 bytes
    honest = c.share(roster)[0]
    with pytest.raises(SecAggError, match="hold 20 bytes"):
        a.reveal({1: short, 2: honest}, [0, 1, 2], [])


def test_the_seed_commitment_binds_the_seed_to_the_client_and_step():
    one = ClientSession(1, 2, b"ctx")
    assert isinstance(one.keys, Keys) and len(one.keys.commitment) == 32
    other_step = ClientSession(1, 2, b"ctx2")
    assert one.keys.commitment != other_step.keys.commitment


def test_a_secure_step_waits_for_the_clients_that_joined_not_for_an_empty_slot(tmp_path):
    """``--start-with 4`` of 5 slots and no deadline: each step's keys round closes once the four joined clients
    have advertised (a slot nobody holds would hold it for ever), and the sum is theirs."""
    run = config(num_clients=N, num_tasks=1, rounds_per_task=2, settings={"secagg": {"enabled": True}})
    coord = Coordinator(run, tmp_path / "state", Options(start_with=N - 1))
    members = list(range(N - 1))
    for i in members:
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", SPEC)
    plan = coord.pull("c0")
    assert isinstance(plan, RoundPlan) and plan.phase == Phase.TRAIN
    step = coord.step
    assert step is not None and isinstance(step.intake, SecureIntake)
    session(coord, members)
    assert coord.step is not step  # the step closed with the four
    assert coord.run.history[-1]["clients"] == N - 1, coord.run.history[-1]
