"""Full fine-tuning baselines (FedAvg, RegMean, Fisher averaging, TIES) on inputs whose answer is known."""

import pytest
import torch
from safetensors.torch import load_file, save_file

from common.aggregation.validate import UpdateRejected
from common.merges.grams import decay_gram
from common.merges.regmean import regmean
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, GramKind
from common.wire.messages import ClientUpdate, ModelSpec, Phase
from common.wire.tensors import DELTA, EXTRA, FISHER, GRAM, HEAD_BIAS, HEAD_GRAM, HEAD_WEIGHT, LORA, head_tensors, pack
from engine.simulation import run_inprocess
from server.strategies import make_strategy

from tolerance import assert_close_to_dtype
from updates import plan_update

SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=3,
    num_classes=4,
    params={
        "emb.weight": (5, 4),
        "l1.base.weight": (3, 4),
        "l1.base.bias": (3,),
        "l2.base.weight": (2, 3),
        "norm.weight": (3,),
    },
)
DENSE = ("fedavg", "regmean", "fisheravg", "ties")
N = [10, 15, 20]  # samples of clients 0, 1, 2


def config(**kw):
    return RunConfig(**{**dict(num_clients=3, num_tasks=2, rounds_per_task=2, seed=1, gamma_head=0.5), **kw})


def gram(g, d, full):
    x = torch.randn(7, d, generator=g, dtype=torch.float64)
    return x.T @ x if full else (x * x).sum(0)


def fake_update(plan, index, *, seed, spec=SPEC):
    g = torch.Generator().manual_seed(seed)
    f = spec.feature_dim
    step = plan.expect(DenseStep)
    delta = {name: torch.randn(*shape, generator=g) for name, shape in spec.params.items()}
    head_weight = torch.randn(spec.num_classes, f, generator=g, dtype=torch.float64)
    head_bias = torch.randn(spec.num_classes, generator=g, dtype=torch.float64)
    grams, head_gram, fisher = {}, None, {}
    if step.gram != GramKind.NONE:
        grams = {name: gram(g, d_in, step.gram == GramKind.FULL) for name, (_, d_in) in spec.layers.items()}
    if step.head_gram:
        head_gram = gram(g, f, True)
    if step.send_fisher:
        shapes = dict(spec.params) | {"head.weight": (spec.num_classes, f), "head.bias": (spec.num_classes,)}
        # about a third of the entries zero, so that some have zero Fisher on every client
        fisher = {
            name: torch.rand(*shape, generator=g, dtype=torch.float64).sub(0.3).clamp(min=0)
            for name, shape in shapes.items()
        }
    return plan_update(
        plan,
        index,
        N[index],
        delta=delta,
        grams=grams,
        fisher=fisher,
        head_weight=head_weight,
        head_bias=head_bias,
        head_gram=head_gram,
    )


def start(name, *, seed=7, spec=SPEC, **kw):
    """A strategy whose global delta and head are already non-zero (as after some rounds)."""
    strategy = make_strategy(config(method=name, **kw), spec)
    g = torch.Generator().manual_seed(seed)
    tensors = {k: torch.randn(*v.shape, generator=g, dtype=v.dtype) for k, v in strategy.state_tensors().items()}
    strategy.load_state_tensors(tensors)
    return strategy


def one_round(strategy, seeds=(0, 1, 2), make=fake_update):
    strategy.begin_task(0)
    plan = strategy.configure(0, 0, Phase.TRAIN)
    ups = [make(plan, i, seed=s) for i, s in enumerate(seeds)]
    fold = strategy.fold(plan)
    agg = fold.aggregator
    for u in ups:
        agg.fold(u)
    fold.finish()
    return plan, ups


def stored(got, want):
    """The server merges in float64 and keeps the encoder's deltas in float32: one rounding apart."""
    assert_close_to_dtype(got, want, torch.float32)


def wmean(xs):
    return sum(n * x.double() for n, x in zip(N, xs)) / sum(N[: len(xs)])


def test_plans_ask_only_for_what_each_method_needs():
    got = {}
    for name in DENSE:
        strategy = start(name)
        plan = strategy.configure(0, 0, Phase.TRAIN)
        assert plan.mode == "full" and plan.instruction.factors() == "" and plan.low_rank(LORA) == {}
        assert all(torch.equal(plan.named(DELTA)[k], strategy.delta[k]) for k in SPEC.params)
        step = plan.expect(DenseStep)
        got[name] = (step.gram, step.head_gram, step.send_fisher)
        ev = strategy.eval_plan(0)  # evaluation sees W0 + delta
        assert ev.phase == Phase.EVALUATE and ev.mode == "full" and ev.low_rank(EXTRA) == {}
        ev_delta = ev.named(DELTA)  # the strategy's own tensors, not copies
        assert ev_delta.keys() == strategy.delta.keys() and all(ev_delta[k] is strategy.delta[k] for k in ev_delta)
        assert strategy.adapter() == {} and strategy.dense_delta() is strategy.delta
        assert strategy.steps(0) == [(Phase.TRAIN, 0), (Phase.TRAIN, 1)]
    assert got == {
        "fedavg": (GramKind.NONE, False, False),
        "regmean": (GramKind.DIAG, True, False),
        "fisheravg": (GramKind.NONE, False, True),
        "ties": (GramKind.NONE, False, False),
    }
    assert start("regmean", gamma_backbone=0.5).configure(0, 0, Phase.TRAIN).expect(DenseStep).gram == GramKind.FULL
    assert make_strategy(config(method="lorm"), SPEC).dense_delta() is None


def test_fedavg_is_the_sample_weighted_mean():
    strategy = start("fedavg")
    old = dict(strategy.delta)
    _, ups = one_round(strategy)
    for name in SPEC.params:
        want = old[name].double() + wmean([u.named(DELTA)[name] for u in ups])
        assert strategy.delta[name].dtype == torch.float32
        stored(strategy.delta[name].double(), want)
    torch.testing.assert_close(strategy.head_w, wmean([u.get(HEAD_WEIGHT) for u in ups]), rtol=0, atol=1e-14)
    torch.testing.assert_close(strategy.head_b, wmean([u.get(HEAD_BIAS) for u in ups]), rtol=0, atol=1e-14)


@pytest.mark.parametrize("gamma", [0.0, 0.5])
def test_regmean_equals_regmean_of_absolute_weights(gamma):
    strategy = start("regmean", gamma_backbone=gamma)
    old = dict(strategy.delta)
    w0 = {name: torch.randn(*shape, dtype=torch.float64) for name, shape in SPEC.params.items()}  # unseen by server
    plan, ups = one_round(strategy)
    assert all(u.named(GRAM)["l1"].dim() == (2 if gamma > 0 else 1) for u in ups)
    for layer in SPEC.layers:
        p = f"{layer}.base.weight"
        absolute = [w0[p] + old[p].double() + u.named(DELTA)[p].double() for u in ups]
        want = regmean(absolute, [decay_gram(u.named(GRAM)[layer], gamma) for u in ups])
        stored(w0[p] + strategy.delta[p].double(), want)
    for p in ("emb.weight", "l1.base.bias", "norm.weight"):  # not a linear layer's weight: the mean
        want = old[p].double() + wmean([u.named(DELTA)[p] for u in ups])
        stored(strategy.delta[p].double(), want)
    head = regmean([u.get(HEAD_WEIGHT) for u in ups], [decay_gram(u.get(HEAD_GRAM), 0.5) for u in ups])
    torch.testing.assert_close(strategy.head_w, head, rtol=0, atol=1e-12)
    torch.testing.assert_close(strategy.head_b, wmean([u.get(HEAD_BIAS) for u in ups]), rtol=0, atol=1e-14)


@pytest.mark.parametrize("estimator", ["sampled", "reference"])
def test_fisheravg_by_hand_with_zero_fisher_fallback(estimator):
    # Clients of 10 and 15 samples. An estimator that averages over samples (sampled) is weighted by the
    # samples, n_i F_i (the shard's Fisher); the reference estimator sums already and counts as it is.
    strategy = start("fisheravg", fisher=estimator)
    old, w_g, b_g = dict(strategy.delta), strategy.head_w.clone(), strategy.head_b.clone()
    weights = (10.0, 15.0) if estimator == "sampled" else (1.0, 1.0)

    def known(plan, index, *, seed):
        u = fake_update(plan, index, seed=seed)
        u.tensors["delta/norm.weight"] = torch.tensor([[1.0, 2.0, 3.0], [3.0, 4.0, 5.0]][index])
        u.tensors["fisher/norm.weight"] = torch.tensor([[1.0, 0.0, 0.0], [3.0, 2.0, 0.0]][index], dtype=torch.float64)
        return u

    _, ups = one_round(strategy, seeds=(0, 1), make=known)
    # sampled: (10*1*1 + 15*3*3) / (10*1 + 15*3); reference: (1*1 + 3*3) / 4; only client 1 has Fisher;
    # no Fisher at all: (10*3 + 15*5) / 25
    first = 145 / 55 if estimator == "sampled" else 2.5
    stored(
        strategy.delta["norm.weight"].double() - old["norm.weight"].double(),
        torch.tensor([first, 4.0, 4.2], dtype=torch.float64),
    )

    def by_hand(xs, fs):
        fs = [w * f for w, f in zip(weights, fs)]
        total = fs[0] + fs[1]
        fallback = (10 * xs[0] + 15 * xs[1]) / 25
        return torch.where(total > 0, (fs[0] * xs[0] + fs[1] * xs[1]) / torch.where(total > 0, total, 1.0), fallback)

    fallbacks = 0
    for name in SPEC.params:
        fs = [u.named(FISHER)[name] for u in ups]
        fallbacks += int(((fs[0] + fs[1]) == 0).sum())
        want = old[name].double() + by_hand([u.named(DELTA)[name].double() for u in ups], fs)
        stored(strategy.delta[name].double(), want)
    assert fallbacks > 1  # beyond the hand-made entry
    want_w = w_g + by_hand([u.get(HEAD_WEIGHT) - w_g for u in ups], [u.named(FISHER)["head.weight"] for u in ups])
    want_b = b_g + by_hand([u.get(HEAD_BIAS) - b_g for u in ups], [u.named(FISHER)["head.bias"] for u in ups])
    torch.testing.assert_close(strategy.head_w, want_w, rtol=0, atol=1e-12)
    torch.testing.assert_close(strategy.head_b, want_b, rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------- TIES


def ties_direct(vectors, density=0.3, lam=0.4):
    """TIES as in its reference: rows = clients, all in memory at once."""
    t = torch.stack(vectors)  # (clients, d)
    d = t.shape[1]
    kth = t.abs().kthvalue(d - max(int(density * d), 1) + 1, dim=1, keepdim=True).values
    t = t * (t.abs() >= kth)  # trim
    sign = torch.sign(t.sum(0))  # elect
    sign[sign == 0] = torch.sign(sign.sum())
    agree = torch.where(sign > 0, t > 0, t < 0)
    return lam * (t * agree).sum(0) / agree.sum(0).clamp(min=1)  # disjoint mean, scaled


TINY = ModelSpec(layers={"l": (1, 2)}, feature_dim=1, num_classes=2, params={"l.base.weight": (1, 2), "b": (4,)})
# entries: l.base.weight (2), b (4), head weight (2), head bias (2); 30 % of 10 -> each client keeps 3
VECTORS = [
    [5, -1, 0.5, 2, -4, 0, 0, 3, 0, -0.1],
    [-5, 2, 0, 3, 1, 0, 0, 3, 0, 0.2],
    [1, 6, 0, -2, -2, 0, 0, -1, 0, 0],
]  # client 2 keeps 6 and both -2 (tied at the threshold)


def flat(strategy, old):
    """The strategy's step this round, flattened in the order of VECTORS."""
    return torch.cat(
        [(strategy.delta[p].double() - old[p].double()).flatten() for p in TINY.params]
        + [strategy.head_w.flatten(), strategy.head_b]
    )


def ties_update(rows):
    def make(plan, index, *, seed):
        v = torch.tensor(rows[index], dtype=torch.float64)
        return ClientUpdate(
            run_id=plan.run_id,
            client_id=f"c{index}",
            client_index=index,
            task=0,
            round=0,
            phase=Phase.TRAIN,
            num_samples=N[index],
            tensors=pack(
                delta={"l.base.weight": v[:2].float().reshape(1, 2), "b": v[2:6].float()},
                head=head_tensors(v[6:8].reshape(2, 1), v[8:10]),
            ),
        )

    return make


@pytest.mark.parametrize("flip, entry0", [(False, 5.0), (True, -5.0)])
def test_ties_streaming_equals_direct_with_ties_and_zeros(flip, entry0):
    rows = [list(r) for r in VECTORS]
    if flip:  # elected signs then sum to 0 as well: the reference's negative branch
        rows[1][3] = -3
    strategy = make_strategy(config(method="ties"), TINY)
    strategy.head_w, strategy.head_b = torch.zeros(2, 1, dtype=torch.float64), torch.zeros(2, dtype=torch.float64)
    old = dict(strategy.delta)
    one_round(strategy, make=ties_update(rows))
    got = flat(strategy, old)
    want = ties_direct([torch.tensor(r, dtype=torch.float64) for r in rows])
    stored(got, want)
    # by hand: entry 0 is a tie (5 - 5) broken by the majority sign, entry 1 only client 2 kept,
    # entry 2 nobody kept, entry 4 both negatives (-4, -2), entry 7 the two 3s (client 2's -1 trimmed)
    hand = {0: entry0, 1: 6.0, 2: 0.0, 4: -3.0, 7: 3.0}
    for i, v in hand.items():
        assert got[i].item() == pytest.approx(0.4 * v)


def test_ties_random_equals_direct_and_adds_to_global_delta():
    strategy = start("ties", extra={"ties_density": 0.5, "ties_lambda": 0.7})
    old, w_g, b_g = dict(strategy.delta), strategy.head_w.clone(), strategy.head_b.clone()
    _, ups = one_round(strategy)
    vectors = [
        torch.cat(
            [u.named(DELTA)[p].double().flatten() for p in SPEC.params]
            + [(u.get(HEAD_WEIGHT) - w_g).flatten(), u.get(HEAD_BIAS) - b_g]
        )
        for u in ups
    ]
    want = ties_direct(vectors, density=0.5, lam=0.7)
    got = torch.cat(
        [(strategy.delta[p].double() - old[p].double()).flatten() for p in SPEC.params]
        + [(strategy.head_w - w_g).flatten(), strategy.head_b - b_g]
    )
    stored(got, want)


# ----------------------------------------------------------------------------- state and rejections


@pytest.mark.parametrize("name", DENSE)
def test_state_round_trips_exactly(name, tmp_path):
    strategy = start(name)
    one_round(strategy)
    tensors = strategy.state_tensors()
    assert {k for k in tensors if k.startswith("delta/")} == {f"delta/{p}" for p in SPEC.params}
    assert all(tensors[f"delta/{p}"].dtype == torch.float32 for p in SPEC.params)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(tmp_path / "s.safetensors"))
    again = make_strategy(config(method=name), SPEC)
    again.load_state_tensors(load_file(str(tmp_path / "s.safetensors")))
    back = again.state_tensors()
    assert set(back) == set(tensors)
    assert all(torch.equal(back[k], tensors[k]) and back[k].dtype == tensors[k].dtype for k in tensors)
    # and the next round merges identically from either
    for s in (strategy, again):
        one_round(s, seeds=(5, 6, 7))
    assert all(torch.equal(strategy.state_tensors()[k], again.state_tensors()[k]) for k in tensors)


def nan_at(t, index=0):
    t.view(-1)[index] = float("nan")


COMMON_BREAKS = [
    (lambda u: u.tensors.pop("delta/norm.weight"), "delta"),
    (lambda u: u.tensors.update({"delta/l1.base.weight": torch.zeros(4, 3)}), "delta/l1.base.weight"),
    (lambda u: nan_at(u.tensors["delta/emb.weight"], 3), "delta/emb.weight"),
    (lambda u: nan_at(u.tensors[HEAD_WEIGHT]), "head/weight"),
    (lambda u: u.tensors.update({HEAD_BIAS: torch.zeros(5, dtype=torch.float64)}), "head/bias"),
]
BREAKS = [(name, *b) for name in DENSE for b in COMMON_BREAKS] + [
    (
        "fisheravg",
        lambda u: u.tensors.update({"fisher/norm.weight": -u.tensors["fisher/norm.weight"] - 1}),
        "fisher/norm.weight",
    ),
    ("fisheravg", lambda u: u.tensors.pop("fisher/head.bias"), "fisher"),
    ("fisheravg", lambda u: nan_at(u.tensors["fisher/l2.base.weight"]), "fisher/l2.base.weight"),
    ("regmean", lambda u: u.tensors.update({"gram/l1": torch.ones(3, dtype=torch.float64)}), "gram/l1"),
    ("regmean", lambda u: nan_at(u.tensors[HEAD_GRAM]), "head/gram"),
]


@pytest.mark.parametrize("name, break_it, field", BREAKS)
def test_rejected_update_changes_nothing(name, break_it, field):
    def run(with_bad):
        strategy = start(name)
        plan = strategy.configure(0, 0, Phase.TRAIN)
        fold = strategy.fold(plan)
        agg = fold.aggregator
        agg.fold(fake_update(plan, 0, seed=0))
        if with_bad:
            bad = fake_update(plan, 1, seed=1)
            break_it(bad)
            with pytest.raises(UpdateRejected) as err:
                agg.fold(bad)
            assert err.value.field == field
        agg.fold(fake_update(plan, 2, seed=2))
        assert agg.count == 2
        fold.finish()
        return strategy.state_tensors()

    clean, dirty = run(False), run(True)
    assert all(torch.equal(clean[k], dirty[k]) for k in clean)


def test_ties_rejects_bad_settings():
    with pytest.raises(ValueError, match=r"ties\.density should lie in \(0, 1\], got 0\.0"):
        make_strategy(config(method="ties", extra={"ties_density": 0.0}), SPEC)
    with pytest.raises(ValueError, match="ModelSpec.params"):
        make_strategy(config(method="fedavg"), ModelSpec(layers={"l": (1, 2)}, feature_dim=1, num_classes=2))


# ----------------------------------------------------------------------------- end to end


@pytest.mark.parametrize("name", DENSE)
def test_end_to_end_in_process(name):
    result = run_inprocess(
        RunConfig(
            method=name,
            num_clients=2,
            num_tasks=2,
            rounds_per_task=1,
            local_epochs=1,
            threads=1,
            extra={"synthetic_classes": 4, "synthetic_train": 20, "synthetic_test": 5},
        )
    )
    totals = result.matrix.total
    assert len(totals) == 2 and [len(row) for row in totals] == [1, 2] and all(t > 0 for row in totals for t in row)
    assert result.adapter == {}
    assert all(h["bytes_per_client"] > 0 for h in result.history if h["phase"] == "train")
