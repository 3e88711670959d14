"""The client half of the full fine-tuning baselines (FedAvg, RegMean, Fisher averaging, TIES).

Trains every backbone weight and the head with ACE, starting from ``W0 + plan.delta``, and
sends ``delta`` (trained minus received weights, per parameter), the head, with
``DenseStep.send_fisher`` the diagonal Fisher of :func:`fisher` (FisherAvg), and the Grams the
plan asks for (``plan.gram``, ``plan.head_gram``: RegMean), as LoRA methods record them.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
import torch.nn.functional as F
from torch import Tensor

from client.methods.base import Client, ClientMethod, load_head, load_lora, sent_head, set_view
from client.methods.lora import gram_pass
from client.persample import PerSampleSquares
from common.run.config import FISHER_SUMMED
from common.wire.instructions import DenseStep, Mode
from common.wire.messages import Phase, RoundPlan
from common.wire.tensors import DELTA, pack


class DenseTrainer(ClientMethod):
    """Every backbone weight ``W = W0 + delta`` and the head, trained with ACE (no LoRA)."""

    mode = Mode.FULL

    def load(self, client: Client, plan: RoundPlan) -> None:
        load_lora(client, plan, delta=plan.named(DELTA))
        load_head(client.model, plan)

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        for layer in client.model.lora().values():
            layer.set_trainable(())
        return list(client.model.dense_params().values())

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        trained = plan.phase == Phase.TRAIN
        # FisherAvg asks for the Fisher with every round, EWC in a step of its own at a task's end.
        sent = fisher(client, plan, shard, seed) if plan.expect(DenseStep).send_fisher else {}
        set_view(client, plan)
        grams, head_gram = gram_pass(client, plan, shard, seed)  # RegMean's Grams of the adapted layers' inputs
        head, delta = sent_head(client.model, plan), dense_delta(client, plan) if trained else {}
        return pack(grams=grams, delta=delta, fisher=sent, head=head, head_gram=head_gram)


def dense_delta(client: Client, plan: RoundPlan) -> dict[str, Tensor]:
    """Trained weights minus the weights this step started from (``W0 + plan.delta``), per parameter."""
    w0, delta = client.model.pristine(), plan.named(DELTA)
    out = {}
    for name, p in client.model.dense_params().items():
        start = w0[name] if name not in delta else w0[name] + delta[name].to(w0[name].dtype)
        out[name] = p.detach().cpu() - start
    return out


FLUSH_EVERY = 64  # squared-gradient terms summed in float32 before they join the float64 Fisher


def fisher(client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
    """Diagonal Fisher of the ACE model ``p(y|x)`` (the task's classes) at the trained weights.

    ``config.fisher`` picks the estimator (``common.run.config.FISHER_ESTIMATORS``), with
    ``g_y = d log p(y|x) / d theta`` per sample ``x`` (eval mode, no dropout):

    - ``sampled``: ``mean_x g_y^2``, ``y ~ p(.|x)`` (Matena & Raffel's Monte Carlo estimate);
    - ``expected``: ``mean_x sum_y p(y|x) g_y^2`` (the exact expectation);
    - ``reference``: ``sum_x p(y_x|x) g_{y_x}^2`` with the true label ``y_x``, summed, not
      averaged, as the paper's public code does;
    - ``batch``: ``sum_b |b| g_b^2 / n`` over mini-batch gradients ``g_b`` of the loss.

    Entries are shaped like their parameters, float64; the head's are named ``head.weight``
    and ``head.bias``.
    """
    model, lo, hi = client.model, *plan.class_range
    params = dict(model.dense_params()) | {f"head.{n}": p for n, p in model.head.named_parameters()}
    names, tensors = list(params), list(params.values())
    for p in tensors:
        p.requires_grad_(True)
    out = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in params.items()}
    # Squared gradients are summed in the parameters' dtype on their device, FLUSH_EVERY terms at a
    # time, then into the float64 result: the float64 conversion of every parameter per sample cost
    # twice the sample's forward and backward (measured on MiniLM, 1 thread: 168 ms against 80 ms;
    # an in-place multiply-add, 11 ms). A chunk's float32 sum is off by at most about
    # FLUSH_EVERY * eps relatively; the merges divide by Fisher sums, so that much is immaterial.
    chunk = {n: torch.zeros_like(p, memory_format=torch.contiguous_format) for n, p in params.items()}
    pending = 0

    def flush() -> None:
        nonlocal pending
        if pending:
            for name, c in chunk.items():
                out[name] += c.detach().cpu().double()
                c.zero_()
            pending = 0

    def counted(terms: int) -> None:
        nonlocal pending
        pending += terms
        if pending >= FLUSH_EVERY:
            flush()

    def add(scalar: Tensor, weight: float, retain: bool = False) -> None:
        grads = torch.autograd.grad(scalar, tensors, allow_unused=True, retain_graph=retain)
        for name, g in zip(names, grads):
            if g is not None:
                chunk[name].addcmul_(g.detach(), g.detach(), value=weight)
        counted(1)

    estimator = client.config.fisher
    generator = torch.Generator().manual_seed(seed ^ 0xF15E)
    model.eval()
    size = client.config.batch_size if estimator == "batch" else client.config.fisher_batch
    # fisher_batch > 1: one forward and backward pass for that many samples, each sample's gradient
    # rebuilt from the layers' rows (client/persample.py)
    squares = PerSampleSquares(model, params, chunk) if estimator != "batch" and size > 1 else None
    total = -(-shard.numel() // size)
    for start in range(0, shard.numel(), size):
        if client.on_batch is not None:
            client.on_batch(start // size + 1, total)
        inputs, labels = client.train.batch(shard[start : start + size], client.device)
        with squares.recording(labels.numel()) if squares is not None else contextlib.nullcontext():
            logits = model(inputs)[0]
        log_p = F.log_softmax(logits[:, lo:hi], dim=1)  # (size, task classes)
        if squares is not None:
            for scalar, weights, retain in per_sample_terms(estimator, log_p, labels - lo, generator):
                squares.add(scalar, weights, retain)
            counted(labels.numel())
        elif estimator == "batch":
            add(F.nll_loss(log_p, labels - lo), float(labels.numel()))
        elif estimator == "reference":
            y = int(labels[0]) - lo
            add(log_p[0, y], float(log_p[0, y].detach().exp()))
        elif estimator == "sampled":
            y = int(torch.multinomial(log_p[0].detach().exp().cpu(), 1, generator=generator))
            add(log_p[0, y], 1.0)
        else:  # expected
            probs = log_p[0].detach().exp().tolist()
            for y, p_y in enumerate(probs):
                add(log_p[0, y], p_y, retain=y + 1 < len(probs))
    flush()
    for p in tensors:
        p.requires_grad_(False)
    scale = 1.0 if estimator in FISHER_SUMMED else 1.0 / max(shard.numel(), 1)
    return {n: f * scale for n, f in out.items()}


def per_sample_terms(
    estimator: str, log_p: Tensor, y: Tensor, generator: torch.Generator
) -> Iterator[tuple[Tensor, Tensor, bool]]:
    """The scalars ``sum_b log p(y_b | x_b)`` of a batch's forward pass ``log_p (batch, classes)``, each
    with its per-sample weights and whether another follows: :func:`fisher`'s per-sample estimators,
    the labels drawn from ``generator`` in the order a sample at a time draws them."""
    rows = torch.arange(log_p.shape[0], device=log_p.device)
    probs = log_p.detach().exp()
    if estimator == "sampled":
        drawn = [int(torch.multinomial(p, 1, generator=generator)) for p in probs.cpu()]  # one copy a batch
        yield log_p[rows, torch.tensor(drawn, device=log_p.device)].sum(), torch.ones_like(probs[:, 0]), False
    elif estimator == "reference":
        picked = log_p[rows, y]
        yield picked.sum(), picked.detach().exp(), False
    else:  # expected
        classes = log_p.shape[1]
        for c in range(classes):
            yield log_p[:, c].sum(), probs[:, c], c + 1 < classes
