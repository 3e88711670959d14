"""The reference code's conventions as settings: FisherAvg's estimators, padding rows in Grams, dropout."""

import dataclasses

import pytest
import torch
import torch.nn.functional as F

from common.run.config import RunConfig
from common.wire.tensors import FACTOR, FISHER, GRAM, HEAD_GRAM

from first_round import TINY, first_update


def head_fisher_by_hand(worker, plan, weigh) -> tuple[torch.Tensor, torch.Tensor]:
    """``sum_x weigh(p, y) * d log p / d (W, b)`` terms of the head, from the trained model's features.

    For a softmax head ``log p_y = (W f + b)_y - logsumexp``, ``d log p_y / d W_c = (1[c=y] - p_c) f``;
    ``weigh(p, y)`` returns per class ``c`` the weight of ``(1[c = y'] - p_c)^2`` summed over ``y'``.
    """
    lo, hi = plan.class_range
    shard = worker.shards[plan.task]
    inputs, labels = worker.train.batch(shard, worker.device)  # where the step left the model
    worker.model.eval()
    with torch.no_grad():
        logits, feats = worker.model(inputs)
    p = F.softmax(logits[:, lo:hi].double(), dim=1)  # (n, classes of the task)
    c = weigh(p, labels - lo)  # (n, classes of the task)
    w = torch.zeros_like(worker.model.head.weight, dtype=torch.float64)
    b = torch.zeros_like(worker.model.head.bias, dtype=torch.float64)
    w[lo:hi] = c.T @ feats.double() ** 2
    b[lo:hi] = c.sum(0)
    return w.cpu(), b.cpu()  # the update's tensors are on the CPU, as the wire carries them


def close(a: torch.Tensor, b: torch.Tensor) -> bool:
    # The update's Fisher sums float32 gradients; the hand version is float64 from float32 features.
    eps = torch.finfo(torch.float32).eps
    return torch.allclose(a, b, rtol=64 * eps, atol=64 * eps * float(b.abs().max()))


def test_expected_fisher_of_the_head_is_p_times_one_minus_p_times_features_squared():
    cfg = RunConfig(method="fisheravg", fisher="expected", **TINY)
    update, worker, plan = first_update(cfg)
    n = worker.shards[0].numel()
    # sum_y p_y (1[c=y] - p_c)^2 = p_c (1 - p_c)
    w, b = head_fisher_by_hand(worker, plan, lambda p, y: p * (1 - p))
    assert close(update.named(FISHER)["head.weight"], w / n) and close(update.named(FISHER)["head.bias"], b / n)


def test_reference_fisher_weighs_the_true_labels_gradient_by_its_probability_and_sums():
    cfg = RunConfig(method="fisheravg", fisher="reference", **TINY)
    update, worker, plan = first_update(cfg)

    def weigh(p, y):
        one_hot = F.one_hot(y, p.shape[1]).double()
        return p.gather(1, y[:, None]) * (one_hot - p) ** 2

    w, b = head_fisher_by_hand(worker, plan, weigh)
    assert close(update.named(FISHER)["head.weight"], w) and close(update.named(FISHER)["head.bias"], b)


def test_sampled_fisher_is_reproducible_and_every_estimator_differs():
    fishers = {}
    for name in ("sampled", "expected", "reference", "batch"):
        update, _, _ = first_update(RunConfig(method="fisheravg", fisher=name, **TINY))
        fishers[name] = update.named(FISHER)["head.bias"]
        assert all(bool((f >= 0).all()) and bool(torch.isfinite(f).all()) for f in update.named(FISHER).values())
    again, _, _ = first_update(RunConfig(method="fisheravg", fisher="sampled", **TINY))
    assert torch.equal(again.named(FISHER)["head.bias"], fishers["sampled"])
    values = list(fishers.values())
    assert all(not torch.equal(a, b) for i, a in enumerate(values) for b in values[i + 1 :])
    with pytest.raises(ValueError, match="fisher must be one of"):
        RunConfig(fisher="empirical")


def test_gram_padding_counts_the_padding_rows_and_nothing_else(tmp_path):
    # Synthetic samples all have 9 tokens: no padding anywhere, so the setting changes nothing.
    base = RunConfig(method="lorm", **TINY)
    plain, worker, _ = first_update(base)
    assert int(worker.train.inputs["attention_mask"].sum(1).min()) == int(
        worker.train.inputs["attention_mask"].sum(1).max()
    )
    padded, _, _ = first_update(dataclasses.replace(base, gram_padding=True))
    grams = plain.named(GRAM)
    assert grams and all(torch.equal(padded.named(GRAM)[k], grams[k]) for k in grams)
    # Utterances of 1 to 6 words: the padded Grams gain the rows of the padding tokens.
    rows = [f"{' '.join([f'w{c}'] * (1 + k % 6))},c{c}" for c in range(4) for k in range(8)]
    (tmp_path / "t.csv").write_text("text,label\n" + "\n".join(rows) + "\n")
    text = RunConfig(
        method="lorm",
        dataset="textfile",
        backbone="tiny-bert",  # own text defaults to MiniLM; the test's word-level tokenizer is tiny-bert's
        data_dir=str(tmp_path),
        num_clients=2,
        num_tasks=2,
        rounds_per_task=1,
        local_epochs=1,
        rank=2,
        threads=1,
        seed=3,
        min_client_samples=2,
        extra={"train_file": "t.csv", "test_file": "t.csv"},
    )
    plain, _, _ = first_update(text)
    padded, _, _ = first_update(dataclasses.replace(text, gram_padding=True))
    plain_grams, padded_grams = plain.named(GRAM), padded.named(GRAM)
    layer = next(name for name in plain_grams if name.endswith("attention.self.query"))
    assert padded_grams[layer].shape == plain_grams[layer].shape
    assert bool((padded_grams[layer] >= plain_grams[layer]).all())  # sums of squares over more rows
    assert not torch.equal(padded_grams[layer], plain_grams[layer])
    # Training does not see it: only the Gram pass counts padding rows.
    assert padded.train_loss == plain.train_loss
    factors = plain.by_layer(FACTOR)
    assert factors and all(torch.equal(padded.by_layer(FACTOR)[k]["B"], factors[k]["B"]) for k in factors)
    assert plain.get(HEAD_GRAM) is not None
    assert torch.equal(padded.get(HEAD_GRAM), plain.get(HEAD_GRAM))  # one pooled row per sample either way


def test_dropout_off_trains_a_different_deterministic_model():
    base = RunConfig(method="lorm", **TINY)
    on, _, _ = first_update(base)
    off, _, _ = first_update(dataclasses.replace(base, train_dropout=False))
    off_again, _, _ = first_update(dataclasses.replace(base, train_dropout=False))
    assert on.train_loss != off.train_loss and off.train_loss == off_again.train_loss
