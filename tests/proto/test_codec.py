"""The wire format: exact round trips, bounded message sizes, and every corruption rejected."""

import math

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from common.methods.fedproto import PROTO
from common.wire.instructions import DenseStep, FeaturesStep, GramKind, Instruction, LoraStep, Mode, PromptStep
from common.wire.messages import ClientUpdate, EvalReport, LowRank, Phase, PullQuery, RoundPlan, Wait
from common.wire.tensors import (
    ANCHOR,
    DELTA,
    EXTRA,
    FACTOR,
    FISHER,
    GRAM,
    HEAD_BIAS,
    HEAD_GRAM,
    HEAD_WEIGHT,
    LORA,
    PROMPT,
    WireError,
    head_tensors,
    low_rank_tensors,
    named_tensors,
    pack,
    parse_tensor_name,
    tensor_name,
)
from proto import codec, streams

MiB = 1 << 20
GRPC_FRAME = 5  # gRPC's length-prefix bytes in front of every message on a stream


def random_tensor(dtype: torch.dtype, shape: tuple[int, ...], seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    if dtype == torch.bool:
        return torch.randint(0, 2, shape, generator=gen).bool()
    if dtype == torch.uint8:
        return torch.randint(0, 256, shape, generator=gen, dtype=torch.uint8)
    if not dtype.is_floating_point:
        info = torch.iinfo(dtype)
        return torch.randint(info.min, info.max, shape, generator=gen, dtype=dtype)
    t = torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)
    if t.numel() >= 4:  # values whose bits a lossy path would change
        special = torch.tensor([float("nan"), float("-inf"), -0.0, 1e-40], dtype=torch.float64)
        t.view(-1)[:4] = special.to(dtype)
    return t


def assert_same(got: torch.Tensor, want: torch.Tensor) -> None:
    """Same dtype, shape and bytes (NaN payloads and -0.0 included)."""
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got.reshape(-1).view(torch.uint8), want.reshape(-1).view(torch.uint8))


DTYPES = list(streams.DTYPES.values())
SHAPES = [(3, 5), (0, 4), ()]  # matrix, empty, 0-d


def make_plan(dtype: torch.dtype, shape: tuple[int, ...]) -> RoundPlan:
    return RoundPlan(
        run_id="run-1",
        phase=Phase.TASK_GRAM,
        task=2,
        round=5,
        class_range=(20, 30),
        seen_classes=30,
        instruction=LoraStep(
            train_factors=("A",), view_scale=0.25, gram=GramKind.FULL, head_gram=True, send_head=False
        ),
        tensors=low_rank_tensors(
            LORA, {"enc.0.q": LowRank(random_tensor(dtype, shape, 1), random_tensor(dtype, shape, 2))}
        )
        | low_rank_tensors(
            EXTRA,
            {
                "enc.0.q": LowRank(random_tensor(dtype, (4, 2), 3), random_tensor(dtype, (2, 6), 4)),
                "enc.1.v": LowRank(random_tensor(dtype, (0, 2), 5), random_tensor(dtype, (2, 0), 6)),
            },
        )
        | head_tensors(random_tensor(dtype, (30, 7), 7), random_tensor(dtype, (30,), 8)),
        seed=2**40 + 3,
    )


def make_update(dtype: torch.dtype = torch.float32, shape: tuple[int, ...] = (3, 5)) -> ClientUpdate:
    return ClientUpdate(
        run_id="run-1",
        client_id="client-a",
        client_index=3,
        task=1,
        round=4,
        phase=Phase.TRAIN,
        num_samples=1234,
        tensors=pack(
            factors={
                "enc.0.q": {"B": random_tensor(dtype, shape, 1), "A": random_tensor(dtype, shape, 2)},
                "enc.0.v": {"A": random_tensor(dtype, (2, 9), 3)},
            },
            grams={
                "enc.0.q": random_tensor(torch.float64, (5,), 4),
                "enc.0.v": random_tensor(torch.float64, (9, 9), 5),
            },
            head=head_tensors(random_tensor(dtype, (10, 7), 6), random_tensor(dtype, (10,), 7)),
            head_gram=random_tensor(torch.float64, (7, 7), 8),
        ),
        train_loss=0.6931,
    )


# ------------------------------------------------------------------------ round trips


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_plan_round_trip_is_byte_exact(dtype, shape):
    plan = make_plan(dtype, shape)

    got = codec.plan_from_proto(codec.plan_to_proto(plan, chunk_bytes=7))

    for name in (
        "run_id",
        "phase",
        "task",
        "round",
        "class_range",
        "seen_classes",
        "instruction",
        "seed",
    ):
        assert getattr(got, name) == getattr(plan, name), name
    step = got.expect(LoraStep)
    assert (step.train_factors, step.view_scale, step.gram) == (("A",), 0.25, GramKind.FULL)
    assert (step.head_gram, step.send_head) == (True, False)
    for kind in (LORA, EXTRA):
        mine, theirs = got.low_rank(kind), plan.low_rank(kind)
        assert mine.keys() == theirs.keys()
        for layer in theirs:
            assert_same(mine[layer].b, theirs[layer].b)
            assert_same(mine[layer].a, theirs[layer].a)
    assert_same(got.get(HEAD_WEIGHT), plan.get(HEAD_WEIGHT))
    assert_same(got.get(HEAD_BIAS), plan.get(HEAD_BIAS))


@pytest.mark.parametrize("mode", [Mode.FULL, Mode.PROMPT])
def test_a_plans_named_tensors_round_trip_by_name(mode):
    """Dense delta, anchor, Fisher, prompt pool and prototypes (each plan kind of named tensors)."""
    g = torch.Generator().manual_seed(4)
    params = {"enc.emb.weight": (5, 3), "enc.norm.bias": (3,)}
    kinds = (DELTA, ANCHOR, FISHER, PROTO) if mode == Mode.FULL else (PROMPT,)
    named = {kind: {n: torch.randn(s, generator=g) for n, s in params.items()} for kind in kinds}
    step = DenseStep() if mode == Mode.FULL else PromptStep(prompt_frozen=2)
    tensors = {name: t for kind, by_name in named.items() for name, t in named_tensors(kind, by_name).items()}
    plan = RoundPlan(
        run_id="r",
        phase=Phase.TRAIN,
        task=1,
        round=0,
        class_range=(2, 4),
        seen_classes=4,
        instruction=step,
        tensors=tensors,
    )
    got = codec.plan_from_proto(codec.plan_to_proto(plan, chunk_bytes=11))
    assert isinstance(got, RoundPlan) and got.mode == mode and got.instruction == step
    if mode == Mode.PROMPT:
        assert got.expect(PromptStep).prompt_frozen == 2
    for kind, tensors in named.items():
        mine = got.named(kind)
        assert mine.keys() == tensors.keys(), kind
        for name in tensors:
            assert_same(mine[name], tensors[name])


def test_plan_without_tensors_round_trips():
    plan = RoundPlan(run_id="r", phase=Phase.DONE, task=9, round=0, class_range=(90, 100), seen_classes=100)

    assert codec.plan_from_proto(codec.plan_to_proto(plan)) == plan


def test_wait_round_trips_as_a_single_message():
    messages = list(codec.wait_to_proto(Wait(retry_after_s=1.5, reason="round 3 still open")))

    assert len(messages) == 1
    assert codec.plan_from_proto(messages) == Wait(1.5, "round 3 still open")


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("dtype", DTYPES)
def test_update_round_trip_is_byte_exact(dtype, shape):
    update = make_update(dtype, shape)

    envelope, got = codec.update_from_proto(codec.update_to_proto(update, "key-1", chunk_bytes=11))

    assert envelope.idempotency_key == "key-1"
    assert envelope.total_bytes == sum(t.numel() * t.element_size() for t in update.tensors.values())
    assert envelope.total_bytes == update.nbytes == got.nbytes
    scalars = ("run_id", "client_id", "client_index", "task", "round", "phase", "num_samples", "train_loss")
    for name in scalars:
        assert getattr(got, name) == getattr(update, name) == getattr(envelope, name), name
    mine, theirs = got.by_layer(FACTOR), update.by_layer(FACTOR)
    assert {k: v.keys() for k, v in mine.items()} == {k: v.keys() for k, v in theirs.items()}
    assert got.named(GRAM).keys() == update.named(GRAM).keys() == {"enc.0.q", "enc.0.v"}
    assert got.tensors.keys() == update.tensors.keys()
    assert {HEAD_WEIGHT, HEAD_BIAS, HEAD_GRAM} <= got.tensors.keys()
    for name, want in update.tensors.items():
        assert_same(got.tensors[name], want)


def test_update_keeps_nan_loss_and_absent_head():
    update = ClientUpdate(
        run_id="r",
        client_id="c",
        client_index=0,
        task=0,
        round=0,
        phase=Phase.TASK_GRAM,
        num_samples=0,
        tensors=pack(grams={"l": torch.ones(3, dtype=torch.float64)}),
    )

    _, got = codec.update_from_proto(codec.update_to_proto(update, "k"))

    assert math.isnan(got.train_loss)
    assert got.get(HEAD_WEIGHT) is None and got.get(HEAD_BIAS) is None and got.get(HEAD_GRAM) is None
    assert got.by_layer(FACTOR) == {} and got.tensors.keys() == {"gram/l"}


def test_eval_round_trip():
    report = EvalReport(run_id="r", client_id="c", client_index=2, task=2, correct=[5, 0, 7], total=[10, 3, 7])

    key, got = codec.eval_from_proto(codec.eval_to_proto(report, "eval-key"))

    assert (key, got) == ("eval-key", report)


@pytest.mark.parametrize("last", [None, (2, 7, Phase.EVALUATE)])
def test_pull_query_round_trip(last):
    query = PullQuery(run_id="r", client_id="c", last_completed=last)

    assert codec.pull_from_proto(codec.pull_to_proto(query)) == query


@settings(max_examples=60, deadline=None)
@given(
    dtype=st.sampled_from(DTYPES),
    shape=st.lists(st.integers(0, 6), max_size=3).map(tuple),
    chunk_bytes=st.integers(1, 40),
    seed=st.integers(0, 2**31 - 1),
)
def test_tensor_chunks_reassemble_exactly(dtype, shape, chunk_bytes, seed):
    tensor = random_tensor(dtype, shape, seed)
    assembler = streams.TensorAssembler([streams.tensor_header("t", tensor)])

    chunks = list(streams.tensor_chunks("t", tensor, chunk_bytes))
    for chunk in chunks:
        assembler.add(chunk)

    assert all(0 < len(c.data) <= chunk_bytes for c in chunks)
    assert_same(assembler.finish()["t"], tensor)


@pytest.mark.parametrize(
    "kind, layer, part, name",
    [
        ("lora", "encoder.layer.0.attention.self.query", "B", "lora/encoder.layer.0.attention.self.query/B"),
        ("extra", "blocks.3.mlp.fc1", "A", "extra/blocks.3.mlp.fc1/A"),
        ("factor", "odd/name", "A", "factor/odd/name/A"),
        ("gram", "blocks.3.mlp.fc2", None, "gram/blocks.3.mlp.fc2"),
        ("w", "x/A", None, "w/x/A"),  # names are open: a kind no shared message names, its name holding '/'
    ],
)
def test_tensor_names_parse_back(kind, layer, part, name):
    assert tensor_name(kind, layer, part) == name
    assert parse_tensor_name(name) == (kind, layer, part)


@pytest.mark.parametrize(
    "name", ["", "lora/x", "lora//B", "gram/", "head/other", "head/x/B", "factor/x/C", "vector/x/C", "/x", "x"]
)
def test_malformed_tensor_names_are_rejected(name):
    with pytest.raises(WireError) as caught:
        parse_tensor_name(name)
    assert caught.value.field == "tensors.name"


# ------------------------------------------------------------------------------ sizes


def test_a_38_mb_gram_travels_in_messages_under_1_1_mib():
    gram = torch.arange(4_750_000, dtype=torch.float64)  # 38 MB, like a 3072-wide full Gram
    update = ClientUpdate(
        run_id="r",
        client_id="c",
        client_index=0,
        task=0,
        round=0,
        phase=Phase.TASK_GRAM,
        num_samples=1,
        tensors=pack(grams={"enc.11.mlp.fc2": gram}),
    )

    messages = list(codec.update_to_proto(update, "k", chunk_bytes=MiB))

    assert len(messages) == 1 + math.ceil(38_000_000 / MiB)
    assert max(m.ByteSize() for m in messages) < 1.1 * MiB
    _, got = codec.update_from_proto(messages)
    assert_same(got.named(GRAM)["enc.11.mlp.fc2"], gram)


def vit_b16_update(r: int = 16) -> ClientUpdate:
    """A ViT-B/16-sized update: 12 blocks x (q, v, fc1, fc2), r=16 factors, diagonal Grams."""
    factors, grams = {}, {}
    for block in range(12):
        for name, (d_out, d_in) in {
            "attn.q": (768, 768),
            "attn.v": (768, 768),
            "mlp.fc1": (3072, 768),
            "mlp.fc2": (768, 3072),
        }.items():
            layer = f"blocks.{block}.{name}"
            factors[layer] = {"B": torch.randn(d_out, r), "A": torch.randn(r, d_in)}
            grams[layer] = torch.rand(d_in, dtype=torch.float64)
    return ClientUpdate(
        run_id="run-1",
        client_id="client-a",
        client_index=0,
        task=0,
        round=0,
        phase=Phase.TRAIN,
        num_samples=5000,
        tensors=pack(factors=factors, grams=grams, head=head_tensors(torch.randn(100, 768), torch.randn(100))),
    )


def wire_overhead(update: ClientUpdate) -> float:
    """Bytes on the stream (messages + gRPC framing) per byte of tensor payload."""
    messages = list(codec.update_to_proto(update, "k", chunk_bytes=MiB))
    wire = sum(m.ByteSize() + GRPC_FRAME for m in messages)
    return wire / codec.update_from_proto(messages)[0].total_bytes


def test_vit_b16_update_wire_overhead_is_at_most_5_percent():
    update = vit_b16_update()
    assert len(update.by_layer(FACTOR)) == 48

    assert wire_overhead(update) <= 1.05


# ------------------------------------------------------------------------ corruptions


def valid_update_stream() -> list:
    update = make_update(torch.float32, (6, 5))  # factor/enc.0.q/B: 120 bytes = 3 chunks of 48, 48, 24
    return list(codec.update_to_proto(update, "k", chunk_bytes=48))


def chunk_indices(messages: list, name: str) -> list[int]:
    return [i for i, m in enumerate(messages) if m.WhichOneof("kind") == "chunk" and m.chunk.name == name]


def header_of(messages: list, name: str):
    return next(h for h in messages[0].envelope.tensors if h.name == name)


def reject(messages, field: str, **kwargs) -> WireError:
    with pytest.raises(WireError) as caught:
        codec.update_from_proto(messages, **kwargs)
    assert caught.value.field == field, str(caught.value)
    return caught.value


B_FACTOR = "factor/enc.0.q/B"


def test_bad_checksum_is_rejected():
    messages = valid_update_stream()
    chunk = messages[chunk_indices(messages, B_FACTOR)[1]].chunk
    chunk.data = bytes([chunk.data[0] ^ 1]) + chunk.data[1:]

    assert reject(messages, "tensors.crc32").tensor == B_FACTOR


def test_truncated_stream_is_rejected():
    messages = valid_update_stream()

    assert reject(messages[:-1], "chunk.data").tensor == messages[-1].chunk.name


def test_out_of_order_chunk_is_rejected():
    messages = valid_update_stream()
    first, second = chunk_indices(messages, B_FACTOR)[:2]
    messages[first], messages[second] = messages[second], messages[first]

    reject(messages, "chunk.offset")


def test_repeated_chunk_is_rejected():
    messages = valid_update_stream()
    i = chunk_indices(messages, B_FACTOR)[0]

    reject(messages[: i + 1] + messages[i:], "chunk.offset")


def test_overflow_past_declared_size_is_rejected():
    messages = valid_update_stream()
    last = messages[chunk_indices(messages, B_FACTOR)[-1]].chunk
    last.data += b"\x00"

    reject(messages, "chunk.data")


def test_undeclared_tensor_is_rejected():
    messages = valid_update_stream()
    declared = messages[0].envelope.tensors
    keep = [h for h in declared if h.name != B_FACTOR]
    del declared[:]
    declared.extend(keep)

    assert reject(messages, "chunk.name").tensor == B_FACTOR


@pytest.mark.parametrize("dtype", ["complex64", "float8_e4m3fn", "object", ""])
def test_unknown_dtype_is_rejected(dtype):
    messages = valid_update_stream()
    header_of(messages, B_FACTOR).dtype = dtype

    reject(messages, "tensors.dtype")


def test_unsupported_dtype_cannot_be_sent():
    update = make_update()
    update.tensors[HEAD_BIAS] = torch.zeros(3, dtype=torch.complex64)

    with pytest.raises(WireError) as caught:
        codec.update_to_proto(update, "k")
    assert caught.value.field == "tensors.dtype"


@pytest.mark.parametrize(
    "mutate",
    [
        lambda h: setattr(h, "nbytes", h.nbytes + 4),
        lambda h: h.shape.append(2),
        lambda h: setattr(h, "dtype", "float64"),
    ],
)
def test_shape_and_size_mismatch_is_rejected(mutate):
    messages = valid_update_stream()
    mutate(header_of(messages, B_FACTOR))

    reject(messages, "tensors.nbytes")


def test_negative_dimension_is_rejected():
    messages = valid_update_stream()
    header = header_of(messages, B_FACTOR)
    header.shape[:] = [-6, -5]

    reject(messages, "tensors.shape")


def test_oversize_declared_submission_is_rejected_before_any_chunk_is_read():
    messages = valid_update_stream()
    header = header_of(messages, B_FACTOR)
    header.shape[:] = [10**6, 10**6]  # 4 TB of float32, declared consistently
    header.nbytes = 4 * 10**12
    read = []

    def stream():
        yield messages[0]
        read.append("chunk")
        yield from messages[1:]

    reject(stream(), "tensors.nbytes")
    assert read == []


def test_submission_cap_is_configurable():
    messages = valid_update_stream()
    total = codec.update_from_proto(messages)[0].total_bytes

    codec.update_from_proto(messages, max_total_bytes=total)
    reject(messages, "tensors.nbytes", max_total_bytes=total - 1)


@pytest.mark.parametrize("cut, field", [(slice(1, None), "envelope"), (slice(0, 0), "envelope")])
def test_stream_without_envelope_is_rejected(cut, field):
    reject(valid_update_stream()[cut], field)


def test_second_envelope_is_rejected():
    messages = valid_update_stream()

    reject(messages + messages[:1], "envelope")


@pytest.mark.parametrize("name", ["factor/enc.0.q", "head/other", "lora//B"])
def test_a_malformed_tensor_name_is_rejected_before_any_chunk_is_read(name):
    """Names are open (any ``<kind>/<name>``), not unchecked: what parses as no tensor name is refused from the
    envelope alone; which names a step may send is the coordinator's check (``common/aggregation/validate.py``)."""
    messages = valid_update_stream()
    header_of(messages, B_FACTOR).name = name
    read = []

    def stream():
        yield messages[0]
        read.append("chunk")
        yield from messages[1:]

    reject(stream(), "tensors.name")
    assert read == []


def test_a_tensor_of_a_kind_no_shared_message_names_round_trips():
    """Names are open: a method's own kind travels in a plan and in an update without a change to the codec."""
    thing, other = random_tensor(torch.float32, (3, 4), 1), random_tensor(torch.int64, (5,), 2)
    plan = RoundPlan(
        run_id="r",
        phase=Phase.TRAIN,
        task=0,
        round=0,
        class_range=(0, 2),
        seen_classes=2,
        instruction=LoraStep(train_factors=("B",)),
        tensors={"x/thing": thing, "x/deep/er.name": other},
    )
    update = ClientUpdate("r", "c", 0, 0, 0, Phase.TRAIN, num_samples=3, tensors={"x/thing": thing})

    got = codec.plan_from_proto(codec.plan_to_proto(plan, chunk_bytes=5))
    _, pushed = codec.update_from_proto(codec.update_to_proto(update, "k", chunk_bytes=5))

    assert isinstance(got, RoundPlan) and got.tensors.keys() == {"x/thing", "x/deep/er.name"}
    assert got.named("x").keys() == {"thing", "deep/er.name"}
    assert_same(got.tensors["x/thing"], thing) and assert_same(got.tensors["x/deep/er.name"], other)
    assert pushed.tensors.keys() == {"x/thing"}
    assert_same(pushed.tensors["x/thing"], thing)


@pytest.mark.parametrize(
    "field, value",
    [
        ("phase", 0),
        ("idempotency_key", ""),
        ("run_id", ""),
        ("client_index", -1),
        ("num_samples", -3),
    ],
)
def test_malformed_envelope_scalar_is_rejected(field, value):
    messages = valid_update_stream()
    setattr(messages[0].envelope, field, value)

    reject(messages, field)


def test_on_envelope_sees_the_envelope_before_any_chunk_and_can_refuse():
    messages = valid_update_stream()

    class Duplicate(Exception):
        pass

    def refuse(envelope):
        assert envelope.idempotency_key == "k" and envelope.client_id == "client-a"
        raise Duplicate

    def stream():
        yield messages[0]
        raise AssertionError("a chunk was read after the envelope was refused")

    with pytest.raises(Duplicate):
        codec.update_from_proto(stream(), on_envelope=refuse)


def test_plan_with_half_a_low_rank_pair_is_rejected():
    messages = list(codec.plan_to_proto(make_plan(torch.float32, (3, 5))))
    header = messages[0].header
    keep = [h for h in header.tensors if h.name != "lora/enc.0.q/A"]
    del header.tensors[:]
    header.tensors.extend(keep)
    messages = [m for m in messages if m.WhichOneof("kind") == "header" or m.chunk.name != "lora/enc.0.q/A"]

    with pytest.raises(WireError) as caught:
        codec.plan_from_proto(messages)
    assert caught.value.field == "tensors.name"


def test_wait_with_tensors_is_rejected():
    messages = list(codec.wait_to_proto(Wait(1.0)))
    messages[0].header.tensors.add(name="head/bias", dtype="float32", nbytes=0)

    with pytest.raises(WireError) as caught:
        codec.plan_from_proto(messages)
    assert caught.value.field == "wait"


@pytest.mark.parametrize(
    "correct, total, field",
    [
        ([1, 2], [3, 3, 3], "correct"),
        ([1, 2, 3], [3, 3], "total"),
        ([1, 4, 0], [3, 3, 3], "correct"),
    ],
)
def test_inconsistent_eval_counts_are_rejected(correct, total, field):
    message = codec.eval_to_proto(EvalReport("r", "c", 0, 2, [0, 0, 0], [0, 0, 0]), "k")
    message.correct[:] = correct
    message.total[:] = total

    with pytest.raises(WireError) as caught:
        codec.eval_from_proto(message)
    assert caught.value.field == field


# ----------------------------------------------------------------------- instructions

MODES = {Mode.LORA: LoraStep, Mode.FULL: DenseStep, Mode.FEATURES: FeaturesStep, Mode.PROMPT: PromptStep}


def train_plan(instruction: Instruction) -> RoundPlan:
    return RoundPlan(
        run_id="r", phase=Phase.TRAIN, task=0, round=0, class_range=(0, 2), seen_classes=2, instruction=instruction
    )


@pytest.mark.parametrize("mode", list(Mode))
def test_plan_mode_round_trips_as_the_enum(mode):
    plan = train_plan(MODES[mode]())

    got = codec.plan_from_proto(codec.plan_to_proto(plan))

    assert got.mode is mode  # the enum member itself, not its string


@pytest.mark.parametrize(
    "instruction",
    [
        LoraStep(
            train_factors=("B", "A"),
            view_scale=0.375,
            train_extra=True,
            send_head=False,
            gram=GramKind.DIAG,
            head_gram=True,
        ),
        LoraStep(train_factors=("A",), gram=GramKind.FULL),
        LoraStep(),
        DenseStep(send_fisher=True, send_head=False, gram=GramKind.FULL, head_gram=True),
        PromptStep(prompt_frozen=3, send_head=False, gram=GramKind.DIAG),
        FeaturesStep(head_gram=True),
        FeaturesStep(send_head=True, gram=GramKind.DIAG),
    ],
    ids=lambda step: step.KIND,
)
def test_each_shared_instruction_round_trips_equal_to_the_original(instruction):
    plan = train_plan(instruction)

    got = codec.plan_from_proto(codec.plan_to_proto(plan))

    assert got == plan
    assert type(got.instruction) is type(instruction) and got.instruction == instruction
    assert got.instruction.factors() == instruction.factors()


def test_the_done_plan_has_no_instruction_and_needs_none_on_the_wire():
    plan = RoundPlan(run_id="r", phase=Phase.DONE, task=0, round=0, class_range=(0, 2), seen_classes=2)
    messages = list(codec.plan_to_proto(plan))
    messages[0].header.ClearField("instruction")

    got = codec.plan_from_proto(messages)

    assert got == plan and type(got.instruction) is Instruction and got.mode is None and got.instruction.factors() == ""


@pytest.mark.parametrize("phase", [Phase.TRAIN, Phase.TASK_GRAM, Phase.FEATURES, Phase.EVALUATE])
def test_a_plan_that_is_not_done_without_an_instruction_is_rejected(phase):
    plan = RoundPlan(
        run_id="r", phase=phase, task=0, round=0, class_range=(0, 2), seen_classes=2, instruction=LoraStep()
    )
    messages = list(codec.plan_to_proto(plan))
    messages[0].header.ClearField("instruction")

    with pytest.raises(WireError) as caught:
        codec.plan_from_proto(messages)
    assert caught.value.field == "instruction" and phase.value in str(caught.value)


def reject_instruction(kind: str, fields_json: str) -> WireError:
    messages = list(codec.plan_to_proto(train_plan(LoraStep(train_factors=("B",)))))
    messages[0].header.instruction.kind = kind
    messages[0].header.instruction.fields_json = fields_json
    with pytest.raises(WireError) as caught:
        codec.plan_from_proto(messages)
    assert caught.value.field == "instruction", str(caught.value)
    assert str(caught.value).startswith("instruction"), str(caught.value)
    return caught.value


def test_an_unknown_instruction_kind_is_rejected():
    error = reject_instruction("sideways", "{}")

    assert "sideways" in str(error) and "features" in str(error)  # what came, and the kinds this side knows


@pytest.mark.parametrize(
    "kind, fields_json, named",
    [
        ("lora", '{"train_factor": ["B"]}', "train_factor"),  # a field it does not have
        ("dense", '{"train_factors": ["B"]}', "train_factors"),  # another instruction's field
        ("lora", '{"view_scale": true}', "view_scale"),  # a bool is never a number
        ("lora", '{"view_scale": "0.5"}', "view_scale"),
        ("lora", '{"send_head": "yes"}', "send_head"),  # a string for a bool
        ("lora", '{"send_head": 1}', "send_head"),  # a number for a bool
        ("prompt", '{"prompt_frozen": 1.5}', "prompt_frozen"),  # a float for an int
        ("prompt", '{"prompt_frozen": false}', "prompt_frozen"),
        ("lora", '{"train_factors": "BA"}', "train_factors"),  # a string for a list of strings
        ("lora", '{"train_factors": ["B", 1]}', "train_factors"),
        ("lora", '{"gram": "dense"}', "gram"),  # not a GramKind
        ("lora", '{"view_scale": NaN}', "view_scale"),  # floats are finite
        ("lora", '{"view_scale": Infinity}', "view_scale"),
        ("lora", '{"view_scale": -1e999}', "view_scale"),
        ("lora", '{"train_factors": ["B", "B"]}', "train_factors"),  # what the class itself refuses
        ("lora", '{"train_factors": ["C"]}', "train_factors"),
        ("prompt", '{"prompt_frozen": -1}', "prompt_frozen"),
        ("lora", "[]", "JSON object"),
        ("lora", "{not json", "JSON"),
    ],
)
def test_a_malformed_instruction_is_rejected_naming_what_is_wrong(kind, fields_json, named):
    error = reject_instruction(kind, fields_json)

    assert named in str(error)


def test_an_instruction_refuses_on_construction_what_the_wire_refuses():
    with pytest.raises(ValueError, match="train_factors"):
        LoraStep(train_factors=("B", "B"))
    with pytest.raises(ValueError, match="prompt_frozen"):
        PromptStep(prompt_frozen=-1)


def test_the_codec_speaks_wire_version_3():
    assert codec.WIRE_VERSION == 3
    codec.check_wire_version(3, "client")  # no error


@pytest.mark.parametrize("theirs, named", [(0, "version 1"), (2, "version 2"), (4, "version 4")])
def test_another_wire_version_is_refused_naming_both(theirs, named):
    with pytest.raises(WireError) as caught:
        codec.check_wire_version(theirs, "client")

    message = str(caught.value)
    assert caught.value.field == "wire_version"
    assert named in message and "version 3" in message and "client" in message
