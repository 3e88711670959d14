"""Validation before anything is folded: every kind of bad input refused, naming the field, changing nothing.

Three levels: every strategy's aggregator against generic corruptions of each tensor it
expects; the coordinator (codes, sample counts, the merged result with and without a bad
client); and the wire (checksums, truncation, sizes) through a real gRPC server.
"""

from __future__ import annotations

import dataclasses
import threading
import time

import grpc
import pytest
import torch

from common.aggregation.validate import PSD_RTOL, UpdateRejected, check_gram, field_of
from common.infra.tls import Security
from common.run.config import RunConfig
from common.wire.messages import ClientUpdate, EvalReport, ModelSpec, Phase
from common.wire.tensors import (
    DELTA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    STAT,
    named_tensors,
    parse_tensor_name,
    tensor_name,
)
from proto import codec
from proto import lorm_pb2 as pb
from proto import lorm_pb2_grpc as pb_grpc
from server.checks import Options, Refused
from server.coordinator import Coordinator
from server.service import create_server
from server.strategies import STRATEGIES, make_strategy

from unit_helpers import valid_update
from updates import plan_update

F64 = torch.float64
# Dense strategies need the backbone's parameters; RegMean needs <layer>.base.weight for every LoRA layer.
SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=3,
    num_classes=6,
    params={"emb.weight": (5, 4), "l1.base.weight": (3, 4), "l1.base.bias": (3,), "l2.base.weight": (2, 3)},
)
N = 12  # samples per client and step


def config(**kw) -> RunConfig:
    base = dict(
        run_id="val",
        num_clients=3,
        num_tasks=2,
        rounds_per_task=1,
        rank=2,
        seed=1,
        extra={"ridge_lambdas": [0.1, 1.0, 10.0], "ridge_holdout": 4},
    )
    return RunConfig(**{**base, **kw})


# ------------------------------------------------------------------ generic corruptions


def _set(t: torch.Tensor, index, value) -> torch.Tensor:
    t = t.clone()
    t[index] = value
    return t


def _indefinite(g: torch.Tensor) -> torch.Tensor:
    """Same non-negative diagonal, but a 2x2 principal minor with negative determinant."""
    off = 2 * float(torch.sqrt(g[0, 0] * g[1, 1])) + 1.0
    return _set(_set(g, (0, 1), off), (1, 0), off)


def corruptions(name: str, t: torch.Tensor) -> list[tuple[str, torch.Tensor | None]]:
    """``(what, corrupted tensor or None for a missing one)`` for one expected tensor."""
    kind, layer, part = parse_tensor_name(name)
    param = kind in (FACTOR, DELTA) or name in (HEAD_WEIGHT, HEAD_BIAS)
    flat = t.reshape(-1)
    cases = [
        ("nan", _set(flat, 0, float("nan")).reshape(t.shape)),
        ("inf", _set(flat, -1, float("-inf")).reshape(t.shape)),
        ("dtype", t.to(torch.float16 if param else torch.float32)),
        ("int dtype", t.to(torch.int64)),
        ("shape", torch.cat([t, t[:1]])),
        ("missing", None),
    ]
    gram = kind == GRAM or name == HEAD_GRAM or (kind == STAT and layer.endswith("gram"))
    if gram and t.dim() == 1:
        cases.append(("negative diagonal", _set(t, 0, -1.0)))
    elif gram:
        cases += [
            ("negative diagonal", _set(t, (1, 1), -1.0)),
            ("asymmetric", _set(t, (0, 1), float(t[0, 1]) + 1.0 + float(t.abs().max()))),
            ("indefinite", _indefinite(t)),
        ]
    if kind == FISHER:
        cases.append(("negative", _set(flat, 0, -1e-3).reshape(t.shape)))
    if kind == STAT and layer.endswith("class_count"):
        nz = int(torch.nonzero(t)[0])
        cases += [("negative count", _set(t, nz, -1.0)), ("fractional count", _set(t, nz, float(t[nz]) + 0.5))]
    return cases


def missing_field(name: str) -> str:
    """What the refusal of an update missing tensor ``name`` names: its kind (the head's tensors by name)."""
    kind, _, _ = parse_tensor_name(name)
    return name if kind == HEAD else kind


VARIANTS = [(name, gamma) for name in sorted(STRATEGIES) for gamma in (0.0, 0.5)]


@pytest.mark.parametrize("name, gamma", VARIANTS)
def test_every_strategy_refuses_each_corruption_of_each_tensor_and_keeps_its_sums(name, gamma):
    """For every step of task 0: a valid update passes; each corruption of each tensor is refused naming
    that tensor's field; after all the refusals, the step merges bit-identically to one that never saw them."""
    cfg = config(method=name, gamma_backbone=gamma)
    refused = 0
    for phase, round_ in make_strategy(cfg, SPEC).steps(0):
        results = []
        for with_bad in (False, True):
            strategy = make_strategy(cfg, SPEC)
            strategy.begin_task(0)
            plan = strategy.configure(0, round_, phase)
            fold = strategy.fold(plan)
            agg = fold.aggregator
            expected = agg.expected()
            agg.fold(valid_update(plan, expected, 0, seed=1))
            if with_bad:
                good = valid_update(plan, expected, 1, seed=2)
                for tname, tensor in good.tensors.items():
                    for what, bad_tensor in corruptions(tname, tensor):
                        tensors = dict(good.tensors)
                        if bad_tensor is None:
                            del tensors[tname]
                        else:
                            tensors[tname] = bad_tensor
                        with pytest.raises(UpdateRejected) as err:
                            agg.fold(dataclasses.replace(good, tensors=tensors))
                        want = field_of(tname) if bad_tensor is not None else missing_field(tname)
                        assert err.value.field == want, (tname, what, str(err.value))
                        refused += 1
                extra = dict(good.tensors) | {tensor_name(FISHER, "stray"): torch.zeros(2, dtype=F64)}
                if tensor_name(FISHER, "stray") not in expected:
                    with pytest.raises(UpdateRejected, match="unexpected"):
                        agg.fold(dataclasses.replace(good, tensors=extra))
                    refused += 1
            agg.fold(valid_update(plan, expected, 2, seed=3))
            fold.finish()
            results.append(strategy.state_tensors())
        clean, dirty = results
        assert clean.keys() == dirty.keys()
        assert all(torch.equal(clean[k], dirty[k]) for k in clean), (phase, round_)
    print(f"{name} gamma={gamma}: {refused} corrupted updates refused")
    assert refused > 0


# ------------------------------------------------------------------ strategy-specific statistics


def ridge_step():
    strategy = make_strategy(config(method="ridge"), SPEC)
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.FEATURES)
    agg = strategy.aggregator(plan)
    return plan, agg, valid_update(plan, agg.expected(), 0, seed=5)


@pytest.mark.parametrize(
    "break_it, field",
    [
        (lambda s: s["class_count"].__setitem__(2, s["class_count"][2] + 1), "stat/class_count"),  # sum != samples
        (
            lambda s: (
                s["class_count"].__setitem__(1, s["class_count"][1] + s["class_count"][0]),  # class 0: no samples,
                s["class_count"].__setitem__(0, 0.0),
            ),
            "stat/class_sum",
        ),  # yet a non-zero sum
        (lambda s: s["class_sum"].mul_(10.0), "stat/class_sum"),  # more than any features of that Gram allow
        (lambda s: s["holdout_class_count"].add_(s["class_count"]), "stat/holdout_class_count"),
        (lambda s: s["holdout_class_sum"].mul_(10.0), "stat/holdout_class_sum"),
    ],
)
def test_ridge_statistics_must_be_consistent(break_it, field):
    plan, agg, update = ridge_step()
    agg.check(update)
    stats = {k: v.clone() for k, v in update.named(STAT).items()}
    break_it(stats)
    update.tensors |= named_tensors(STAT, stats)
    with pytest.raises(UpdateRejected) as err:
        agg.check(update)
    assert err.value.field == field


def test_count_sum_must_equal_num_samples():
    _, agg, update = ridge_step()
    update.num_samples += 1
    with pytest.raises(UpdateRejected) as err:
        agg.check(update)
    assert err.value.field == "stat/class_count"


def test_gram_check_tolerates_rounding_and_rank_deficiency_and_is_affordable():
    """Real Grams pass: rank-deficient (fewer samples than features) and with float64 rounding; 768 is fast."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(100, 768, generator=g, dtype=F64) * 3
    gram = x.T @ x  # rank 100 of 768: 668 zero eigenvalues, computed as +-rounding
    start = time.perf_counter()
    check_gram("g", gram)
    assert time.perf_counter() - start < 2.0
    v = torch.randn(768, generator=g, dtype=F64)
    v /= v.norm()
    bent = gram - 10 * PSD_RTOL * float(gram.trace()) * torch.outer(v, v)  # lambda_min = -10 x tolerance
    with pytest.raises(UpdateRejected, match="positive semidefinite"):
        check_gram("g", bent)


# ------------------------------------------------------------------ the coordinator

LORM = ModelSpec(layers={"l1": (5, 4), "l2": (3, 6)}, feature_dim=4, num_classes=6)


def started(path, spec=LORM, options=None, **kw) -> Coordinator:
    coord = Coordinator(config(**kw), path, options or Options())
    for i in range(3):
        coord.join(f"c{i}", i)
        coord.describe(f"c{i}", spec)
    return coord


def update_of(coord: Coordinator, index: int, seed: int) -> ClientUpdate:
    step = coord.step
    return valid_update(step.plan, step.aggregator.expected(), index, seed)


def refused(call) -> Refused:
    with pytest.raises(Refused) as err:
        call()
    return err.value


def snapshot(coord: Coordinator) -> tuple:
    """Everything a refused call must leave as it was."""
    files = sorted(
        (str(p.relative_to(coord.store.root)), p.stat().st_size) for p in coord.store.root.rglob("*") if p.is_file()
    )
    return coord.status(), list(coord.run.history), files, coord.step.next_fold, set(coord.step.submitted)


def _replace(name: str, bad):
    """A corruption of an update: its tensor ``name`` replaced by ``bad(tensor)``."""
    return lambda u: u.tensors.update({name: bad(u.tensors[name])})


BAD_UPDATES = [
    (_replace("factor/l1/B", lambda t: _set(t, (0, 0), float("nan"))), "factor/l1/B"),
    (_replace(HEAD_GRAM, _indefinite), "head/gram"),
    (_replace("gram/l2", lambda t: _set(t, 1, -2.0)), "gram/l2"),
    (_replace(HEAD_WEIGHT, lambda t: t.double().half()), "head/weight"),
    (lambda u: setattr(u, "num_samples", 0), "num_samples"),
    (lambda u: setattr(u, "num_samples", -5), "num_samples"),
    (lambda u: setattr(u, "num_samples", 5), "num_samples"),  # below min_client_samples = 6
    (lambda u: setattr(u, "num_samples", 10**12), "num_samples"),  # above Options.max_num_samples
    (lambda u: setattr(u, "train_loss", float("inf")), "train_loss"),
    (lambda u: setattr(u, "train_loss", -0.5), "train_loss"),
]


def test_bad_updates_are_invalid_argument_naming_the_field_and_change_nothing(tmp_path):
    coord = started(tmp_path / "s")
    coord.submit(update_of(coord, 0, 1), "k0")
    before = snapshot(coord)
    for break_it, field in BAD_UPDATES:
        bad = update_of(coord, 1, 2)
        break_it(bad)
        err = refused(lambda bad=bad: coord.submit(bad, "k1"))
        assert err.code == "INVALID_ARGUMENT" and str(err).startswith(field + ":"), (field, str(err))
        assert snapshot(coord) == before


def test_sample_count_bound_from_train_per_class(tmp_path):
    coord = started(tmp_path / "s", train_per_class=2)  # task 0 has 3 classes: at most 6 samples per client
    bad = update_of(coord, 0, 1)  # N = 12 samples
    err = refused(lambda: coord.submit(bad, "k0"))
    assert err.code == "INVALID_ARGUMENT" and "num_samples" in str(err) and "[6, 6]" in str(err)


@pytest.mark.parametrize("field, value", [("run_id", "other"), ("task", 1), ("round", 1), ("phase", Phase.TASK_GRAM)])
def test_wrong_run_task_round_or_phase_is_failed_precondition(tmp_path, field, value):
    coord = started(tmp_path / "s")
    before = snapshot(coord)
    bad = update_of(coord, 0, 1)
    setattr(bad, field, value)
    assert refused(lambda: coord.submit(bad, "k0")).code == "FAILED_PRECONDITION"
    assert (
        refused(lambda: coord.precheck("c0", 0, bad.run_id, bad.task, bad.round, bad.phase, "k")).code
        == "FAILED_PRECONDITION"
    )
    assert snapshot(coord) == before


def run_step(path, bad_first: bool, options=None, skip: int | None = None) -> dict[str, torch.Tensor]:
    """One LoRM training round of 3 clients; client 1 first pushes every bad update of BAD_UPDATES when
    ``bad_first``; client ``skip`` sends no good update (the step then closes at its deadline)."""
    coord = started(path, options=options)
    for i in (0, 1, 2):
        if bad_first and i == 1:
            for break_it, _ in BAD_UPDATES:
                bad = update_of(coord, 1, 20)
                break_it(bad)
                with pytest.raises(Refused):
                    coord.submit(bad, "bad")
        if i != skip:
            coord.submit(update_of(coord, i, 10 + i), f"k{i}")
    if skip is not None:
        time.sleep(options.round_deadline_s + 0.05)
        coord.tick()
    assert coord.status()["phase"] == Phase.TASK_GRAM  # the round merged
    return coord.run.strategy.state_tensors() | {"history": coord.run.history}


def _same(a: dict, b: dict) -> bool:
    history = a.pop("history") == b.pop("history")
    return history and a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_refused_then_good_merges_bit_identically_to_never_refused(tmp_path):
    assert _same(run_step(tmp_path / "a", bad_first=False), run_step(tmp_path / "b", bad_first=True))


def test_bad_client_that_never_recovers_equals_the_run_without_it(tmp_path):
    options = Options(quorum=2, round_deadline_s=0.3)
    without = run_step(tmp_path / "a", bad_first=False, options=options, skip=1)
    bad_only = run_step(tmp_path / "b", bad_first=True, options=options, skip=1)
    assert without["history"][0]["clients"] == 2
    assert _same(without, bad_only)


def to_evaluation(path) -> Coordinator:
    """A coordinator whose open step is task 0's evaluation (rounds_per_task = 1: TRAIN, TASK_GRAM, EVALUATE)."""
    coord = started(path)
    for _ in range(2):
        for i in range(3):
            coord.submit(update_of(coord, i, i), f"k{coord.step.index}-{i}")
    assert coord.step.phase == Phase.EVALUATE
    return coord


def test_eval_counts_are_checked(tmp_path):
    coord = to_evaluation(tmp_path / "s")
    options_cap = coord.options.max_num_samples
    before = snapshot(coord)
    for correct, total, code in [
        ([5, 1], [6], "INVALID_ARGUMENT"),
        ([7], [6], "INVALID_ARGUMENT"),
        ([-1], [6], "INVALID_ARGUMENT"),
        ([1], [options_cap + 1], "INVALID_ARGUMENT"),
    ]:
        report = EvalReport("val", "c0", 0, 0, correct, total)
        assert refused(lambda report=report: coord.report_eval(report, "e0")).code == code
    assert (
        refused(lambda: coord.report_eval(EvalReport("val", "c0", 0, 1, [1, 1], [2, 2]), "e0")).code
        == "FAILED_PRECONDITION"
    )  # task 1 is not being evaluated
    assert refused(lambda: coord.submit(update_of_plan(coord), "x")).code == "FAILED_PRECONDITION"
    assert snapshot(coord) == before
    capped = to_evaluation(tmp_path / "t")
    capped.config.test_per_class = 2  # task 0 has 3 classes: at most 6 test samples
    assert refused(lambda: capped.report_eval(EvalReport("val", "c0", 0, 0, [1], [7]), "e0")).code == "INVALID_ARGUMENT"
    assert coord.report_eval(EvalReport("val", "c0", 0, 0, [5], [6]), "e0") is True


def update_of_plan(coord: Coordinator) -> ClientUpdate:
    plan = coord.step.plan
    return plan_update(
        plan,
        0,
        N,
    )


def test_describe_with_an_impossible_model_changes_nothing(tmp_path):
    coord = Coordinator(config(), tmp_path / "s")
    coord.join("c0", 0)
    bad = ModelSpec(layers={"l1": (5, 4)}, feature_dim=4, num_classes=1)  # 1 class cannot make 2 tasks
    assert refused(lambda: coord.describe("c0", bad)).code == "INVALID_ARGUMENT"
    assert coord.run.spec is None and coord.run.strategy is None
    for text in [
        '{"layers": {"l": [0, 4]}, "feature_dim": 4, "num_classes": 6}',
        "[]",
        "1e999",
        "[" * 100_000,
        '{"layers": {"l": [1e999, 4]}, "feature_dim": 4, "num_classes": 6}',
    ]:
        with pytest.raises(ValueError):
            ModelSpec.from_json(text)


# ------------------------------------------------------------------ the wire


@pytest.fixture
def served(tmp_path):
    coord = started(tmp_path / "s", options=Options(max_push_bytes=50_000))
    server, port = create_server(coord, "127.0.0.1:0", security=Security(insecure=True))
    server.start()
    coord.target = f"127.0.0.1:{port}"  # for tests that need a channel of their own
    channel = grpc.insecure_channel(coord.target, options=codec.CHANNEL_OPTIONS)
    yield coord, pb_grpc.CoordinatorStub(channel)
    channel.close()
    server.stop(0)


def stub_target(coord: Coordinator) -> str:
    return coord.target


def push(stub, messages) -> grpc.RpcError | pb.PushReply:
    try:
        return stub.Push(iter(messages), timeout=20)
    except grpc.RpcError as err:
        return err


def encoded(update: ClientUpdate, key: str = "k", chunk_bytes: int = 64) -> list[pb.UpdateChunk]:
    return list(codec.update_to_proto(update, key, chunk_bytes=chunk_bytes))


def test_wire_corruptions_are_invalid_argument_naming_the_field(served):
    coord, stub = served
    good = update_of(coord, 0, 1)
    before = snapshot(coord)
    cases = {}
    msgs = encoded(good)
    msgs[0].envelope.tensors[0].crc32 ^= 1
    cases["tensors.crc32"] = msgs
    msgs = encoded(good)
    msgs[-1].chunk.data = bytes([msgs[-1].chunk.data[0] ^ 0x40]) + msgs[-1].chunk.data[1:]
    cases["tensors.crc32 "] = msgs  # a flipped payload bit: the checksum catches it
    cases["chunk.data"] = encoded(good)[:-1]  # truncated: the last chunk never comes
    msgs = encoded(good)
    msgs[0].envelope.tensors[0].nbytes += 4
    cases["tensors.nbytes"] = msgs  # declared size disagrees with shape and dtype
    msgs = encoded(good)
    i = next(i for i in range(1, len(msgs) - 1) if msgs[i].chunk.name == msgs[i + 1].chunk.name)
    msgs[i], msgs[i + 1] = msgs[i + 1], msgs[i]
    cases["chunk.offset"] = msgs  # two chunks of one tensor swapped
    msgs = encoded(good)
    cases["chunk.offset "] = msgs[:2] + msgs[1:]  # a chunk sent twice
    bigger = update_of(coord, 0, 1)
    bigger.tensors[tensor_name(GRAM, "l1")] = torch.ones(5, dtype=F64)  # one entry more than d_in = 4
    cases["gram/l1"] = encoded(bigger)
    stray = update_of(coord, 0, 1)
    stray.tensors[tensor_name(FISHER, "x")] = torch.zeros(3, dtype=F64)
    cases["fisher"] = encoded(stray)
    for field, msgs in cases.items():
        err = push(stub, msgs)
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT, field
        assert field.strip() in err.details(), (field, err.details())
    assert snapshot(coord) == before
    assert push(stub, encoded(good)).accepted  # and the good one is still welcome


def test_oversized_pushes_are_refused_before_their_bytes_are_buffered(served):
    coord, stub = served
    before = snapshot(coord)
    huge = update_of(coord, 0, 1)
    huge.tensors[HEAD_GRAM] = torch.eye(200, dtype=F64)  # 320 kB: over this step's size (about 1 kB)
    for cap_first in (False, True):
        released = threading.Event()

        def stream(released=released):
            msgs = encoded(huge, chunk_bytes=1 << 16)
            yield msgs[0]
            released.wait(20)  # chunks only after the reply: the server must decide on the envelope alone
            yield from msgs[1:]

        coord.options.max_push_bytes = 1_000 if cap_first else 10 << 20  # the configured cap, or the step's
        err = push(stub, stream())
        released.set()
        assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert "tensors.nbytes" in err.details()
        assert ("over the limit of 1000" if cap_first else "this step's update is at most") in err.details()
    assert snapshot(coord) == before


def test_a_message_over_the_grpc_limit_is_resource_exhausted(served):
    coord, stub = served
    before = snapshot(coord)
    good = update_of(coord, 0, 1)
    msgs = encoded(good)
    # In the middle of the stream, where a too-big chunk would be. gRPC Python shows the handler
    # an oversized message as a plain end of stream (the core has already answered
    # RESOURCE_EXHAUSTED), so what makes this deterministic is that the chunks after it never
    # arrive: the update is incomplete and must not be staged. (Junk after a complete update
    # can be staged or not, depending on which core event is seen first; the client sees
    # RESOURCE_EXHAUSTED either way, and its retry with the same idempotency key is then
    # "already recorded", so nothing is lost or counted twice.)
    msgs.insert(len(msgs) - 1, pb.UpdateChunk(chunk=pb.TensorChunk(name="head/gram", offset=0, data=b"\0" * (9 << 20))))
    with grpc.insecure_channel(stub_target(coord)) as unlimited:  # no client-side send limit
        err = push(pb_grpc.CoordinatorStub(unlimited), msgs)
    assert isinstance(err, grpc.RpcError) and err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert snapshot(coord) == before
    assert stub.Status(pb.StatusRequest(), timeout=10).run_id == "val"
    assert push(stub, encoded(good)).accepted  # the same update, whole, is then welcome


def test_other_rpcs_refuse_wrong_runs_and_malformed_requests(served):
    coord, stub = served
    before = snapshot(coord)
    calls = [
        (grpc.StatusCode.FAILED_PRECONDITION, lambda: stub.Status(pb.StatusRequest(run_id="other"), timeout=10)),
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: list(stub.Pull(pb.PullRequest(run_id="x", client_id="c0"), timeout=10)),
        ),
        (grpc.StatusCode.INVALID_ARGUMENT, lambda: list(stub.Pull(pb.PullRequest(run_id="val"), timeout=10))),
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: stub.Describe(
                pb.ModelDescription(run_id="x", client_id="c0", model_spec_json=LORM.to_json()), timeout=10
            ),
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: stub.Describe(pb.ModelDescription(run_id="val", client_id="c0", model_spec_json="{"), timeout=10),
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: stub.Join(pb.JoinRequest(client_id="", wire_version=codec.WIRE_VERSION), timeout=10),
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: stub.Join(
                pb.JoinRequest(client_id="c9", requested_index=-1, wire_version=codec.WIRE_VERSION), timeout=10
            ),
        ),
        (
            grpc.StatusCode.INVALID_ARGUMENT,
            lambda: stub.ReportEval(
                pb.EvalReport(
                    run_id="val", client_id="c0", client_index=0, task=0, idempotency_key="e", correct=[3], total=[2]
                ),
                timeout=10,
            ),
        ),
        (
            grpc.StatusCode.FAILED_PRECONDITION,
            lambda: stub.ReportEval(
                pb.EvalReport(
                    run_id="val", client_id="c0", client_index=0, task=0, idempotency_key="e", correct=[1], total=[2]
                ),
                timeout=10,
            ),
        ),  # no evaluation is open
    ]
    for code, call in calls:
        with pytest.raises(grpc.RpcError) as err:
            call()
        assert err.value.code() == code, err.value.details()
    assert snapshot(coord) == before
