"""Secure aggregation of a step: for every method whose merge needs sums only, the unmasked
sums equal the plain sums within the fixed point's stated bound and the merge then gives what plain
folding gives; with clients dropped after sharing, the sums are the survivors'; the coordinator's
session never holds one client's unmasked terms; methods that need individual updates refuse."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import torch

from common.aggregation.base import make_aggregator
from common.aggregation.declared import HELD_FIT, HOLDOUT
from common.aggregation.validate import UpdateRejected
from common.merges.sums import running_sums, summable
from common.run.config import RunConfig
from common.run.settings import SecAggSettings
from common.secagg.primitives import SecAggError, encode
from common.secagg.terms import Layout, client_terms, context, fixed_point, pack, unpack
from common.wire.instructions import LoraStep
from common.wire.messages import ModelSpec, Phase
from common.wire.tensors import HEAD_BIAS, HEAD_GRAM
from lab.secure_rounds import Timings, secure_step
from server.secure import check_sums, require_secure
from server.strategies import STRATEGIES, make_strategy

from unit_helpers import valid_update

F64 = torch.float64
EPS = torch.finfo(F64).eps
SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=3,
    num_classes=6,
    params={"emb.weight": (5, 4), "l1.base.weight": (3, 4), "l1.base.bias": (3,), "l2.base.weight": (2, 3)},
)
SETTINGS = SecAggSettings(enabled=True)
INDIVIDUAL = {"ties", "pilora"}  # their merges need each client's update


def config(name: str, clients: int = 3, settings: dict | None = None) -> RunConfig:
    """``name``: a method, or ``ridge-blocks`` (ridge, an ensemble of two heads on 4-wide projections; with
    secure aggregation in its configuration, so that its ``auto`` lambda rule is the members'), or ``ridge-views``
    (the same with two dropout views: the held-out samples' share of the sums comes too)."""
    ridge: dict = {"ridge": {"lambdas": [0.1, 1.0, 10.0], "holdout": 4}} if "ridge" in name else {}
    if name in ("ridge-blocks", "ridge-views"):
        ridge["ridge"] |= {"rp_dim": 4, "blocks": 2} | ({"views": 2} if name == "ridge-views" else {})
        ridge["secagg"] = {"enabled": True}
    return RunConfig(
        run_id="sec",
        method=name.split("-")[0] if name.startswith("ridge-") else name,
        num_clients=clients,
        num_tasks=2,
        rounds_per_task=1,
        rank=2,
        seed=1,
        settings=ridge | (settings or {}),
    )


def gap(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a - b).abs().max()) if a.numel() else 0.0


def steps(name: str, clients: int, **fields):
    """Every step of both tasks: ``(plain strategy, secure strategy, plan, updates)``, the two strategies
    brought to the step by the same plain merges (``fields``: the run's configuration's, changed)."""
    cfg = dataclasses.replace(config(name, clients), **fields)
    plain, secure = make_strategy(cfg, SPEC), make_strategy(cfg, SPEC)
    for task in range(2):
        plain.begin_task(task)
        secure.begin_task(task)
        for phase, round_ in plain.steps(task):
            plan = plain.configure(task, round_, phase)
            expected = plain.aggregator(plan).expected()
            updates = {i: valid_update(plan, expected, i, seed=100 * task + 10 * round_ + i) for i in range(clients)}
            yield cfg, plain, secure, plan, updates


@pytest.mark.parametrize("name", [*sorted(set(STRATEGIES) - INDIVIDUAL), "ridge-blocks", "ridge-views"])
def test_unmasked_sums_equal_the_plain_sums_and_the_merge_follows(name):
    """Per step: the coordinator's unmasked sums equal the plain aggregator's running sums within
    ``clients x 2^-(f+1)`` (plus float64 rounding of the plain sums), and the merged state agrees."""
    checked = 0
    for cfg, plain, secure, plan, updates in steps(name, clients=3):
        plain_fold, secure_fold = plain.fold(plan), secure.fold(plan)
        folded, got = plain_fold.aggregator, secure_fold.aggregator
        for update in updates.values():
            folded.fold(update)
        secure_step(got, SPEC, cfg, updates, SETTINGS, cfg.num_clients)
        want, have = running_sums(folded), running_sums(got)
        assert want.keys() == have.keys()
        fp = fixed_point(SETTINGS, cfg.num_clients)
        for key in want:
            scale = float(want[key].abs().max()) if want[key].numel() else 0.0
            bound = fp.error_bound(cfg.num_clients) + 4 * cfg.num_clients * scale * EPS
            assert gap(want[key], have[key]) <= bound, key
        assert got.count == folded.count == 3 and got.num_samples == folded.num_samples
        plain_fold.finish()
        secure_fold.finish()
        a, b = plain.state_tensors(), secure.state_tensors()
        assert a.keys() == b.keys()
        for key in a:  # float64 rounding, amplified by the solves' conditioning
            assert torch.allclose(a[key].to(F64), b[key].to(F64), rtol=1e-9, atol=1e-12), (name, plan.phase, key)
        checked += 1
    assert checked >= 2


def test_terms_are_what_the_coordinator_folds_and_lorm_sends_factor_sized_terms():
    """A client's terms are the running sums of the step's aggregator after its update; LoRM's B-round
    terms per layer are (d_out, r) and (r, r) sums, not B_i and a Gram."""
    cfg, plain, _, plan, updates = next(steps("lorm", clients=3))
    assert plan.expect(LoraStep).train_factors == ("B",)
    terms = client_terms(plain.aggregator(plan), updates[0])
    folded = plain.aggregator(plan)
    folded.fold(updates[0])
    assert terms.keys() == running_sums(folded).keys()
    assert all(torch.equal(terms[k], v) for k, v in running_sums(folded).items())
    assert terms["layers/l1/numerator"].shape == (3, 2) and terms["layers/l1/projected"].shape == (2, 2)


def test_a_client_checks_its_own_update_before_masking():
    cfg, plain, _, plan, updates = next(steps("lorm", clients=3))
    bad = updates[0]
    bad.tensors[HEAD_BIAS] = torch.full_like(bad.tensors[HEAD_BIAS], float("nan"))
    with pytest.raises(UpdateRejected, match=HEAD_BIAS):
        client_terms(plain.aggregator(plan), bad)


@pytest.mark.parametrize("name", ["lorm", "ridge", "fedavg"])
def test_clients_dropped_after_sharing_leave_the_survivors_sums(name):
    """5 clients, threshold 3: two vanish after the share round; the step completes and its sums are
    those of the three survivors folded plainly."""
    for cfg, plain, secure, plan, updates in steps(name, clients=5):
        got = secure.aggregator(plan)
        clock = Timings()
        server = secure_step(got, SPEC, cfg, updates, SETTINGS, 5, drop_after_sharing=(1, 3), timings=clock)
        assert server.close_inputs() == ([0, 2, 4], [1, 3])
        assert sorted(clock.client) == [0, 1, 2, 3, 4] and min(clock.client.values()) > 0 and clock.server > 0
        survivors = plain.aggregator(plan)
        for i in (0, 2, 4):
            survivors.fold(updates[i])
        want, have = running_sums(survivors), running_sums(got)
        fp = fixed_point(SETTINGS, 5)
        for key in want:
            scale = float(want[key].abs().max()) if want[key].numel() else 0.0
            assert gap(want[key], have[key]) <= fp.error_bound(3) + 20 * scale * EPS, key
        assert got.count == 3
        break  # the first step is enough per method


def test_a_singular_gram_passes_the_psd_check_at_few_fractional_bits():
    """Honest clients whose summed Gram is singular (rank one here; fewer samples than features, as with a wide
    projection)
    under a coarse fixed point (``secagg.frac_bits`` 8): each entry's rounding, up to ``clients x 2^-9``, turns the
    summed Gram's zero eigenvalues negative by up to ``d`` times that, and the coordinator's check allows exactly the
    fixed point's rounding, so the step merges. A sum below that floor is still refused."""
    coarse = SecAggSettings(enabled=True, frac_bits=8)
    cfg, _, secure, plan, updates = next(steps("regmean", clients=3, gamma_head=1.0))  # the head's Gram undecayed
    v = torch.randn(SPEC.feature_dim, generator=torch.Generator().manual_seed(51), dtype=F64)
    for i, update in updates.items():  # the head's Gram, the step's full one: every client's along v
        update.tensors[HEAD_GRAM] = (1.3 + i) * torch.outer(v, v)
    got = secure.aggregator(plan)
    secure_step(got, SPEC, cfg, updates, coarse, cfg.num_clients)
    sums = running_sums(got)
    grams = {k: t for k, t in sums.items() if k.endswith("/total") and t.dim() == 2}
    lows = [float(torch.linalg.eigvalsh(t).min()) for t in grams.values()]
    assert min(lows) < -1e-6  # the rounding pushed a zero eigenvalue below what float64 alone explains
    rounding = fixed_point(coarse, 3).error_bound(3)
    check_sums(got, sums, clients=3, rounding=rounding)
    name, gram = next(iter(grams.items()))
    d = gram.shape[0]
    worse = dict(sums, **{name: gram - 2 * rounding * d * torch.eye(d, dtype=F64)})
    with pytest.raises(UpdateRejected, match="positive semidefinite"):
        check_sums(got, worse, clients=3, rounding=rounding)


@pytest.mark.parametrize("name", ["ridge", "ridge-blocks", "ridge-views"])
def test_class_sums_beyond_their_gram_are_refused_in_the_unmasked_sum(name):
    """A hostile client's class sums put, on each block, twice the summed Gram's least eigenvalue into its
    eigenvector: ``sum_c |S_c|^2 / n_c`` within the Gram's trace, but ``sum_c S_c S_c^T / n_c`` beyond the Gram, so
    the coordinator refuses the unmasked sum, as the per-update check refuses one such update in a plain run. Also:
    a sum for a class nobody counted. With distributed noise on the class sums (``noised``) the test is left out: no
    Gram bounds the noise."""
    folded, sums = held_out_step(name)
    check_sums(folded, sums, clients=3)  # honest
    whole = next(key for key in sums if key.endswith("/grams/gram/total"))
    key = whole.replace("grams/gram/total", "plain/class_sum")
    count = sums[key.replace("class_sum", "class_count")]
    parts = []
    for block in sums[whole].reshape(-1, *sums[whole].shape[-2:]):
        values, vectors = torch.linalg.eigh(block)
        assert 2 * values[0] < values.sum()  # within the trace
        lengths = (2 * values[0] * count / int((count > 0).sum())).sqrt()  # sum_c length^2 / n_c = 2 x the least
        parts.append(lengths.unsqueeze(1) * vectors[:, 0])
    turned = dict(sums, **{key: torch.cat(parts, dim=1)})
    with pytest.raises(UpdateRejected, match="exceeds it"):
        check_sums(folded, turned, clients=3)
    check_sums(folded, turned, clients=3, noised=True)
    empty = dict(sums)
    empty[key] = sums[key].clone()
    empty[key][int(torch.nonzero(count == 0)[0])] = 1.0  # a class nobody counted (this task's classes are the first)
    with pytest.raises(UpdateRejected, match="no samples must have a zero sum"):
        check_sums(folded, empty, clients=3)


@pytest.mark.parametrize("covariance", ["full", "diag"])
def test_ccvr_moments_below_the_means_are_refused_in_the_unmasked_sum(covariance):
    """CCVR's summed second moments below what the summed class sums imply (a negative covariance: with full ones
    the merge could not sample the class, and the run would stop) are refused in the unmasked sum, as one such update
    is at the fold in a plain run (tests/server/test_ccvr.py). The honest sum passes."""
    run = steps("ccvr", clients=3, settings={"ccvr": {"covariance": covariance}})
    _, plain, _, plan, updates = next(step for step in run if step[3].phase == Phase.FEATURES)
    folded = plain.aggregator(plan)
    for update in updates.values():
        folded.fold(update)
    sums = running_sums(folded)
    check_sums(folded, sums, clients=3)  # honest
    means = sums["sums/plain/class_sum"] / sums["sums/plain/class_count"].clamp_min(1).sqrt().unsqueeze(1)
    implied = torch.einsum("cf,cg->cfg", means, means) if covariance == "full" else means * means
    low = dict(sums, **{"sums/plain/class_moment": 0.5 * implied})  # positive semidefinite, half what the sums imply
    with pytest.raises(UpdateRejected, match="second moments are below"):
        check_sums(folded, low, clients=3)


@pytest.mark.parametrize("d", [1, 7, 60])
def test_the_psd_floor_refuses_exactly_below_it(d):
    """The summed Gram's test refuses exactly when its least eigenvalue is below ``-(1e-9 max|G| + rounding) d -
    slack``, whatever settles it (a shifted Cholesky passes what is above; the eigenvalues decide the rest): Grams
    of known spectrum, with the least eigenvalue at fractions and multiples of that floor, and a singular one."""
    folded, _ = held_out_step("ridge")
    q, _ = torch.linalg.qr(torch.randn(d, d, generator=torch.Generator().manual_seed(d), dtype=F64))
    rounding, slack = 1e-4, 2e-3
    for times in (0.0, 0.5, 0.99, 1.01, 2.0, 50.0):
        spectrum = torch.linspace(0.0, 40.0, d, dtype=F64)
        spectrum[0] = 0.0
        gram = q @ torch.diag(spectrum) @ q.T
        gram = (gram + gram.T) / 2
        floor = (1e-9 * max(float(gram.abs().max()), 1.0) + rounding) * d + slack
        spectrum[0] = -times * floor
        gram = q @ torch.diag(spectrum) @ q.T
        gram = (gram + gram.T) / 2
        sums = {"head/grams/total": gram}
        if times < 1:
            check_sums(folded, sums, clients=3, gram_slack=slack, rounding=rounding)
        else:
            with pytest.raises(UpdateRejected, match="positive semidefinite"):
                check_sums(folded, sums, clients=3, gram_slack=slack, rounding=rounding)


def test_too_many_dropped_fails_the_step_with_a_reason():
    cfg, plain, secure, plan, updates = next(steps("lorm", clients=5))
    with pytest.raises(SecAggError, match="fewer than the threshold 3"):
        secure_step(secure.aggregator(plan), SPEC, cfg, updates, SETTINGS, 5, (0, 1, 2))


def test_the_coordinators_session_holds_no_individual_term():
    """Everything the coordinator's session stores (keys, sealed shares, the masked total, the revealed
    shares) and the aggregator it loads: no array equals, and no byte string contains, one client's
    encoded terms or any 8-byte word of them; the sealed shares do not contain the plain shares."""
    cfg, plain, secure, plan, updates = next(steps("lorm", clients=4))
    got = secure.aggregator(plan)
    server = secure_step(got, SPEC, cfg, updates, SETTINGS, 4, drop_after_sharing=(2,))
    fp = fixed_point(SETTINGS, 4)
    encoded = []
    for u in updates.values():
        terms = client_terms(make_aggregator(plan, SPEC, cfg), u)  # what the client masked
        encoded.append(encode(Layout.of(terms).flatten(terms), fp))
    stored: list[bytes] = [server.total.tobytes()]
    stored += [k.cipher_public + k.mask_public for k in server.keys.values()]
    stored += [box for boxes in server.boxes.values() for box in boxes.values()]
    stored += [s for shares in server.revealed.values() for s in shares.values()]
    blob = b"".join(stored)
    for e in encoded:
        assert not np.array_equal(server.total, e)
        words = {w.tobytes() for w in e.reshape(-1) if w not in (0, 2**64 - 1)}  # skip words of 0 and -1
        assert not any(w in blob for w in words)
    assert summable(got)  # it holds sums only, and it is the survivors' sum
    assert server.inputs == [0, 1, 3] and context(plan) == server.context


@pytest.mark.parametrize("name", sorted(INDIVIDUAL))
def test_methods_that_need_individual_updates_refuse(name):
    cfg = config(name)
    with pytest.raises(SecAggError, match=f"{name} cannot run with secure aggregation"):
        require_secure(cfg, make_strategy(cfg, SPEC))


def test_the_ensembles_average_rule_refuses():
    """``ridge.lambda_rule = 'average'`` keeps the held-out samples' factors stacked (``GramRows``), not summed:
    refused by name with secure aggregation configured, and by the check of sums-only steps otherwise; ``auto``
    takes the members' rule under secure aggregation and the average's without it."""
    blocks = {"lambdas": [0.1, 1.0, 10.0], "holdout": 4, "rp_dim": 4, "blocks": 2}
    with pytest.raises(ValueError, match="lambda_rule = 'average' needs the held-out samples' Gram whole"):
        make_strategy(config("ridge-blocks", settings={"ridge": blocks | {"lambda_rule": "average"}}), SPEC)
    plain = config("ridge-blocks", settings={"ridge": blocks | {"lambda_rule": "average"}, "secagg": {}})
    with pytest.raises(SecAggError, match=r"ridge cannot run .* sums/grams/holdout_gram \(GramRows\) keeps more"):
        require_secure(plain, make_strategy(plain, SPEC))
    auto = config("ridge-blocks")  # secure aggregation configured
    assert not make_strategy(auto, SPEC).average_rule
    require_secure(auto, make_strategy(auto, SPEC))  # the members' rule: sums only
    assert make_strategy(config("ridge-blocks", settings={"ridge": blocks, "secagg": {}}), SPEC).average_rule


def test_robust_mode_and_secure_aggregation_exclude_each_other():
    cfg = config("lorm", settings={"robust": {"enabled": True}})
    with pytest.raises(SecAggError, match="exclude each other"):
        require_secure(cfg, make_strategy(cfg, SPEC))


def test_square_grams_travel_as_their_lower_triangle():
    """``pack`` sends a summed Gram's lower triangle (what Cholesky and eigh read), ``unpack`` restores
    the symmetric matrix exactly; other sums pass unchanged."""
    g = torch.Generator().manual_seed(3)
    x = torch.randn(7, 5, generator=g, dtype=F64)
    gram = torch.tril(x.T @ x) + torch.tril(x.T @ x, -1).T  # exactly symmetric
    sums = {"head/grams/total": gram, "head/numerator": torch.randn(3, 5, generator=g, dtype=F64)}
    sums["layers/l1/projected"] = torch.eye(2, dtype=F64)
    packed = pack(sums)
    assert set(packed) == {"head/grams/total@tril", "head/numerator", "layers/l1/projected"}
    assert packed["head/grams/total@tril"].numel() == 15
    back = unpack(packed)
    assert back.keys() == sums.keys() and all(torch.equal(back[k], sums[k]) for k in sums)
    with pytest.raises(SecAggError, match="no lower triangle"):
        unpack({"g/total@tril": torch.zeros(7, dtype=F64)})


def test_a_block_grams_blocks_travel_as_their_lower_triangles():
    """``ridge.blocks``: the summed diagonal blocks ``(K, d, d)`` as ``(K, d(d+1)/2)`` lower triangles, exactly."""
    x = torch.randn(3, 6, 4, generator=torch.Generator().manual_seed(4), dtype=F64)
    blocks = x.transpose(1, 2) @ x
    blocks = torch.tril(blocks) + torch.tril(blocks, -1).transpose(1, 2)  # exactly symmetric
    packed = pack({"sums/grams/gram/total": blocks})
    assert packed["sums/grams/gram/total@tril"].shape == (3, 10)
    assert torch.equal(unpack(packed)["sums/grams/gram/total"], blocks)
    with pytest.raises(SecAggError, match="no lower triangle"):
        unpack({"g/total@tril": torch.zeros(3, 7, dtype=F64)})


def held_out_step(name: str):
    """The features step of ``name`` (a ridge with a held-out rule): its aggregator with the honest clients'
    updates folded, and their summed terms, as the coordinator unmasks them."""
    for _, plain, _, plan, updates in steps(name, clients=3):
        folded = plain.aggregator(plan)
        for update in updates.values():
            folded.fold(update)
        sums = running_sums(folded)
        if any(HOLDOUT + "gram/total" in key for key in sums):
            return folded, sums
    raise AssertionError(f"{name} has no step with held-out sums")


@pytest.mark.parametrize("name", ["ridge", "ridge-blocks", "ridge-views"])
def test_a_held_out_share_above_the_whole_gram_is_refused_in_the_unmasked_sum(name):
    """A hostile client sends a held-out share of the Gram (``heldfit_`` with views) with nothing behind it in its
    whole Gram: the sum the lambda fit keeps (whole minus held-out) turns indefinite, and the coordinator refuses
    the unmasked sum, though each summed Gram on its own is positive semidefinite. An excess within the honest
    clients' kept Gram cannot be told from the sum and passes (docs/RELIABILITY.md). Also: more held-out samples
    than samples in a class, a share counting other samples than the held-out ones, and with views a clean held-out
    Gram (which scores lambda) beyond 1 + V times the share it is part of."""
    folded, sums = held_out_step(name)
    share = HELD_FIT if any(HELD_FIT in key for key in sums) else HOLDOUT
    held = next(key for key in sums if key.endswith(f"/{share}gram/total"))
    whole, count = held.replace(share + "gram", "gram"), held.replace(f"grams/{share}gram/total", "plain/class_count")
    check_sums(folded, sums, clients=3)  # honest
    blocks = sums[whole].reshape(-1, *sums[whole].shape[-2:])
    kept = blocks - sums[held].reshape(blocks.shape)
    top = float(max(torch.linalg.eigvalsh(b).max() for b in kept))
    attack = dict(sums)
    attack[held] = sums[held] + (2 * top * torch.eye(blocks.shape[-1], dtype=F64)).expand_as(blocks).reshape(
        sums[held].shape
    )
    assert all(float(torch.linalg.eigvalsh(b).min()) >= 0 for b in attack[held].reshape(blocks.shape))
    with pytest.raises(UpdateRejected, match="held-out samples' summed Gram exceeds the whole's"):
        check_sums(folded, attack, clients=3)
    within = dict(sums)
    within[held] = sums[held] + (0.5 * kept).reshape(sums[held].shape)  # half of what the others keep
    check_sums(folded, within, clients=3)
    counts = dict(sums)
    counts[count.replace("class_count", HOLDOUT + "class_count")] = sums[count] + 1
    with pytest.raises(UpdateRejected, match="holds out more than it has"):
        check_sums(folded, counts, clients=3)
    if share == HELD_FIT:  # the clean held-out Gram, which scores lambda, beyond 1 + V = 3 times the share
        clean = held.replace(HELD_FIT, HOLDOUT)
        shares = sums[held].reshape(blocks.shape)
        extra = 3 * shares - sums[clean].reshape(blocks.shape)  # what is left below the bound: PSD when honest
        scores = dict(sums)
        scores[clean] = sums[clean] + (extra + top * torch.eye(blocks.shape[-1], dtype=F64)).reshape(sums[clean].shape)
        with pytest.raises(UpdateRejected, match="summed clean Gram exceeds 3 times their summed share"):
            check_sums(folded, scores, clients=3)
        scores[clean] = sums[clean] + (0.5 * extra).reshape(sums[clean].shape)  # within the bound
        check_sums(folded, scores, clients=3)
        fit = dict(sums)
        held_count = sums[count.replace("class_count", HOLDOUT + "class_count")]
        fit[count.replace("class_count", HELD_FIT + "class_count")] = held_count + 1
        with pytest.raises(UpdateRejected, match="must count the held-out samples"):
            check_sums(folded, fit, clients=3)
