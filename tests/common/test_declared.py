"""The tensors a step declares: one declaration, read by the client that builds an update and the
coordinator that validates it."""

import ast
from pathlib import Path

import pytest
import torch

from client.methods.lora import LoRATrainer
from client.runtime import build_runtime
from common.aggregation import declared
from common.aggregation.declared import check_declared_shapes, declared_tensors
from common.methods import registry
from common.run.config import RunConfig
from common.wire.instructions import DenseStep, FeaturesStep, GramKind, Instruction, LoraStep
from common.wire.messages import ModelSpec, Phase, RoundPlan
from common.wire.tensors import UpTo

SPEC = ModelSpec(
    layers={"l1": (3, 4), "l2": (2, 3)},
    feature_dim=5,
    num_classes=6,
    params={"emb.weight": (7, 4), "l1.base.weight": (3, 4)},
)


def plan(instruction: Instruction | None = None, **fields) -> RoundPlan:
    return RoundPlan(
        **{
            "run_id": "r",
            "phase": Phase.TRAIN,
            "task": 1,
            "round": 0,
            "class_range": (2, 4),
            "seen_classes": 4,
            "instruction": LoraStep() if instruction is None else instruction,
            **fields,
        }
    )


def test_a_lorm_round_declares_its_factor_grams_head_and_head_gram():
    got = declared_tensors(
        plan(LoraStep(train_factors=("A",), gram=GramKind.DIAG, head_gram=True)), SPEC, RunConfig(rank=2)
    )

    assert got == {
        "factor/l1/A": (2, 4),
        "factor/l2/A": (2, 3),
        "gram/l1": (4,),
        "gram/l2": (3,),
        "head/weight": (6, 5),
        "head/bias": (6,),
        "head/gram": (5, 5),
    }


@pytest.mark.parametrize("gram, l2", [(GramKind.DIAG, (3,)), (GramKind.FULL, (2, 2))])
def test_a_vera_ld_round_declares_the_smaller_of_the_diagonal_gram_and_a_g_a_t(gram, l2):
    # rank 2: A G A^T has 4 entries; l1's diagonal Gram has 4 too (not fewer: A G A^T), l2's 3 (sent
    # as it is, where diagonal: a full Gram never travels)
    config = RunConfig(method="lorm-vera", settings={"vera": {"rank": 2}})

    got = declared_tensors(plan(LoraStep(train_factors=("A",), gram=gram, send_head=False)), SPEC, config)

    assert got == {"factor/l1/A": (2,), "factor/l2/A": (2,), "gram/l1": (2, 2), "gram/l2": l2}


def test_a_fisheravg_round_declares_deltas_head_and_fisher_of_both():
    got = declared_tensors(plan(DenseStep(send_fisher=True)), SPEC, RunConfig(method="fisheravg"))

    assert got == {
        "delta/emb.weight": (7, 4),
        "delta/l1.base.weight": (3, 4),
        "head/weight": (6, 5),
        "head/bias": (6,),
        "fisher/emb.weight": (7, 4),
        "fisher/l1.base.weight": (3, 4),
        "fisher/head.weight": (6, 5),
        "fisher/head.bias": (6,),
    }


def test_a_ridge_features_step_declares_the_task_rows_and_gram_factors_up_to_the_projected_width():
    config = RunConfig(method="ridge", settings={"ridge": {"rp_dim": 9, "holdout": 3}})

    got = declared_tensors(plan(FeaturesStep(head_gram=True, send_head=False)), SPEC, config)

    assert got == {
        "stat/class_sum": (2, 9),
        "stat/class_count": (2,),
        "stat/gram_factor": (9, 9),
        "stat/holdout_class_sum": (2, 9),
        "stat/holdout_class_count": (2,),
        "stat/holdout_gram_factor": (9, 9),
    }
    assert isinstance(got["stat/gram_factor"][0], UpTo) and not isinstance(got["stat/gram_factor"][1], UpTo)


def test_a_ridge_blocks_step_declares_one_factor_per_diagonal_block_up_to_its_width():
    """The training Gram as its K diagonal blocks' factors; the held-out one likewise under the members' rule
    (and ``auto`` with secure aggregation), whole under the average's (``auto`` without)."""
    step = plan(FeaturesStep(head_gram=True, send_head=False))
    members = RunConfig(method="ridge", settings={"ridge": {"rp_dim": 4, "blocks": 3, "lambda_rule": "members"}})
    got = declared_tensors(step, SPEC, members)
    assert got["stat/class_sum"] == (2, 12)  # the three members' projections side by side
    assert got["stat/gram_factor"] == got["stat/holdout_gram_factor"] == (3, 4, 4)
    assert [isinstance(dim, UpTo) for dim in got["stat/gram_factor"]] == [False, True, False]
    auto = {"ridge": {"rp_dim": 4, "blocks": 3}}
    secure = declared_tensors(step, SPEC, RunConfig(method="ridge", settings=auto | {"secagg": {"enabled": True}}))
    assert secure["stat/holdout_gram_factor"] == (3, 4, 4)
    average = declared_tensors(step, SPEC, RunConfig(method="ridge", settings=auto))
    assert average["stat/gram_factor"] == (3, 4, 4) and average["stat/holdout_gram_factor"] == (12, 12)
    assert isinstance(average["stat/holdout_gram_factor"][0], UpTo)


@pytest.mark.parametrize("covariance, moment", [("full", (2, 5, 5)), ("diag", (2, 5))])
def test_a_ccvr_features_step_declares_the_moments_its_settings_describe(covariance, moment):
    config = RunConfig(method="ccvr", settings={"ccvr": {"covariance": covariance}})

    got = declared_tensors(plan(FeaturesStep()), SPEC, config)

    assert got == {"stat/class_sum": (2, 5), "stat/class_count": (2,), "stat/class_moment": moment}


def test_ccvr_sends_moments_of_the_features_its_head_scores_whatever_the_ncm_section_says():
    """CCVR calibrates a head on the backbone's own features (F = 5 here): a closed-form head's projection in
    the ``ncm`` section must not widen its statistics (it once did, 160 wide, against a head 5 wide)."""
    config = RunConfig(method="ccvr", settings={"ncm": {"rp_dim": 160}})

    got = declared_tensors(plan(FeaturesStep()), SPEC, config)

    assert got["stat/class_sum"] == (2, 5) and got["stat/class_moment"] == (2, 5, 5)


def test_the_declaration_names_no_method():
    """The shared declaration knows the ways of training: of the methods it imports only the registry, and no
    method's name or settings section appears in it (a slice declares its own, its settings describe its
    features step)."""
    tree = ast.parse(Path(declared.__file__).read_text())
    imported = {node.module for node in ast.walk(tree) if isinstance(node, ast.ImportFrom) and node.module}
    words = {node.value for node in ast.walk(tree) if isinstance(node, ast.Constant) and isinstance(node.value, str)}
    names = set(registry()) | {m.settings.section for m in registry().values() if m.settings is not None}

    assert {m for m in imported if m.startswith("common.methods")} == {"common.methods"}
    assert not words & names


def test_the_check_names_missing_unexpected_and_misshapen_tensors():
    declared = {"head/weight": (6, 5), "head/bias": (6,), "stat/gram_factor": (UpTo(9), 9)}
    check_declared_shapes({"head/weight": (6, 5), "head/bias": (6,), "stat/gram_factor": (4, 9)}, declared, "x")

    with pytest.raises(
        ValueError,
        match=r"me: .*missing \['head/bias'\], unexpected \['gram/l1'\], "
        r"shapes \[\('head/weight', \(5, 6\), \(6, 5\)\)\]",
    ):
        check_declared_shapes({"head/weight": (5, 6), "gram/l1": (4,), "stat/gram_factor": (4, 9)}, declared, "me")


class Chatty(LoRATrainer):
    """A client half that sends a Gram its plan did not ask for."""

    def outputs(self, client, plan, shard, seed):
        return super().outputs(client, plan, shard, seed) | {"gram/stray": torch.zeros(2, dtype=torch.float64)}


def test_a_worker_refuses_to_send_what_the_step_does_not_declare():
    config = RunConfig(
        method="head-only",
        num_clients=2,
        local_epochs=0,
        threads=1,
        settings={"data": {"synthetic_classes": 4, "synthetic_train": 8, "synthetic_test": 2}},
    )
    worker = build_runtime(config).worker(0, "c0")
    worker.method = Chatty()

    with pytest.raises(
        ValueError, match=r"Chatty: the step declares 2 tensors; missing \[\], unexpected \['gram/stray'\]"
    ):
        worker.update(plan(task=0, class_range=(0, 2), seen_classes=2))
