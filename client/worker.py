"""A client's work for one step of the run: local training, Gram pass, evaluation.

The worker holds no state between steps except its data: every step starts from what the
plan carries (shared factors, head, frozen deltas), with a fresh optimiser and a seed derived
from the plan, so the same plan gives the same update in any process.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from client.backbones import ClassifierModel
from client.features import feature_logits, feature_stats
from common.config import RunConfig
from common.lora import GramRecorder
from common.messages import ClientUpdate, EvalReport, GramKind, Mode, Phase, RoundPlan
from common.partition import dirichlet_partition, task_ranges, client_test_indices

GRAM_BATCH = 64  # no gradients in a Gram pass: larger batches, same sums
PHASE_CODE = {Phase.TRAIN: 1, Phase.TASK_GRAM: 2, Phase.EVALUATE: 3}


class SampleData(Protocol):
    """A client's samples: labels known up front, inputs produced batch by batch.

    ``batch(idx, device, train=..., generator=..., padded=...)`` returns the model inputs and
    labels of the samples ``idx``; with ``train=True`` it may apply the dataset's training
    augmentation, drawing its randomness from ``generator`` only (so a step is reproducible).
    ``padded=True`` keeps text padded to the longest sample of the whole split (images: no effect).
    """

    labels: Tensor  # (n,) int64

    def __len__(self) -> int: ...

    def batch(self, idx: Tensor, device: torch.device, *, train: bool = False,
              generator: torch.Generator | None = None, padded: bool = False) -> tuple[dict[str, Tensor], Tensor]: ...


@dataclass
class EncodedData:
    """Encoded inputs ``name -> (n, ...)`` and labels ``(n,)``, all on the CPU (no augmentation)."""

    inputs: dict[str, Tensor]
    labels: Tensor

    def __len__(self) -> int:
        return int(self.labels.shape[0])

    def batch(self, idx: Tensor, device: torch.device, *, train: bool = False,
              generator: torch.Generator | None = None, padded: bool = False) -> tuple[dict[str, Tensor], Tensor]:
        inputs = {k: v[idx] for k, v in self.inputs.items()}
        mask = inputs.get("attention_mask")
        if mask is not None:
            # Trim padding columns that no sample of this batch uses (same outputs, less work), or with
            # ``padded`` those that no sample of the split uses (the width of padding=True over the split).
            width = max(int((self.inputs["attention_mask"] if padded else mask).sum(1).max()), 1)
            inputs = {k: v[:, :width] if v.dim() >= 2 and v.shape[1] == mask.shape[1] else v
                      for k, v in inputs.items()}
        return {k: v.to(device) for k, v in inputs.items()}, self.labels[idx].to(device)


def step_seed(seed: int, client_index: int, task: int, round_: int, phase: Phase) -> int:
    """A 63-bit seed unique to one client's step."""
    state = np.random.SeedSequence([seed, client_index, task, round_, PHASE_CODE[phase]]).generate_state(2)
    return int(state[0]) << 31 ^ int(state[1])


def resolve_device(name: str) -> torch.device:
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    return torch.device(name)


class ClientWorker:
    """Client ``client_index`` of ``config.num_clients``, with its shard of ``train`` and ``test``."""

    def __init__(self, config: RunConfig, client_index: int, client_id: str, model: ClassifierModel,
                 train: SampleData, test: SampleData, device: torch.device) -> None:
        self.config, self.index, self.client_id = config, client_index, client_id
        self.model, self.train, self.test, self.device = model, train, test, device
        num_classes = model.head.out_features
        self.tasks = task_ranges(num_classes, config.num_tasks, config.task_sizes)
        shards = dirichlet_partition(train.labels.numpy(), self.tasks, config.num_clients, config.beta,
                                     config.seed, config.min_client_samples)
        self.shards = [torch.from_numpy(s[client_index]) for s in shards]  # per task: sample indices
        self.test_idx = torch.from_numpy(client_test_indices(len(test), config.num_clients, client_index))

    def handle(self, plan: RoundPlan) -> ClientUpdate | EvalReport:
        if plan.phase == Phase.EVALUATE:
            return self.evaluate(plan)
        if plan.phase in (Phase.TRAIN, Phase.TASK_GRAM):
            return self.update(plan)
        raise ValueError(f"a client cannot handle phase {plan.phase}")

    # ----------------------------------------------------------------- model set-up

    def _load(self, plan: RoundPlan) -> None:
        """Set the plan's LoRA factors and head, in the training view ``W0 + s B A`` (``W0 + extra + s B A``
        with ``plan.train_extra``).

        In full mode the backbone weights become ``W0 + plan.delta`` instead (no LoRA).
        """
        if plan.mode == Mode.FULL or self.model._pristine is not None:
            self._load_dense(plan.delta if plan.mode == Mode.FULL else {})
        for name, layer in self.model.lora().items():
            if name in plan.lora:
                layer.load_factors(plan.lora[name].b, plan.lora[name].a)
            layer.scale = self.config.lora_scale if name in plan.lora else 0.0
            extra = plan.extra.get(name) if plan.train_extra else None
            layer.set_extra(extra.b if extra else None, extra.a if extra else None)
        if plan.head_weight is not None and plan.mode != Mode.FEATURES:  # features mode: head of width F'
            with torch.no_grad():
                self.model.head.weight.copy_(plan.head_weight)
                self.model.head.bias.copy_(plan.head_bias)

    @torch.no_grad()
    def _load_dense(self, delta: dict[str, Tensor]) -> None:
        w0 = self.model.pristine()
        for name, p in self.model.dense_params().items():
            value = w0[name] if name not in delta else w0[name] + delta[name].to(w0[name].dtype)
            p.copy_(value.to(p.device))

    def _dense_delta(self, plan: RoundPlan) -> dict[str, Tensor]:
        """Trained weights minus the weights this step started from (``W0 + plan.delta``)."""
        w0 = self.model.pristine()
        out = {}
        for name, p in self.model.dense_params().items():
            start = w0[name] if name not in plan.delta else w0[name] + plan.delta[name].to(w0[name].dtype)
            out[name] = p.detach().cpu() - start
        return out

    def _set_view(self, plan: RoundPlan) -> None:
        """Switch to the Gram-pass / evaluation view ``W0 + extra + lora_scale * s B A``."""
        for name, layer in self.model.lora().items():
            layer.scale = self.config.lora_scale * plan.lora_scale if name in plan.lora else 0.0
            extra = plan.extra.get(name)
            layer.set_extra(extra.b if extra else None, extra.a if extra else None)

    # ----------------------------------------------------------------- steps

    def update(self, plan: RoundPlan) -> ClientUpdate:
        seed = step_seed(plan.seed, self.index, plan.task, plan.round, plan.phase)
        shard = self.shards[plan.task]
        self.model.to(self.device)
        self._load(plan)
        if plan.mode == Mode.FEATURES:  # closed-form heads: no training, statistics of the frozen features
            self._set_view(plan)
            stats = feature_stats(self.model, self.train, shard, self.config, self.device, plan.class_range,
                                  gram=plan.head_gram)
            return ClientUpdate(run_id=plan.run_id, client_id=self.client_id, client_index=self.index,
                                task=plan.task, round=plan.round, phase=plan.phase,
                                num_samples=int(shard.numel()), stats=stats)
        loss = self._train(plan, shard, seed) if plan.phase == Phase.TRAIN else float("nan")
        full = plan.mode == Mode.FULL and plan.phase == Phase.TRAIN
        fisher = self._fisher(plan, shard, seed) if full and plan.send_fisher else {}
        self._set_view(plan)
        grams, head_gram = self._gram_pass(plan, shard, seed)
        layers = self.model.lora()
        factors = {name: {f: getattr(layer, f"lora_{f}").detach().cpu().clone() for f in plan.train_factors}
                   for name, layer in layers.items()} if plan.train_factors else {}
        head = self.model.head
        return ClientUpdate(
            run_id=plan.run_id, client_id=self.client_id, client_index=self.index, task=plan.task,
            round=plan.round, phase=plan.phase, num_samples=int(shard.numel()), factors=factors,
            grams=grams,
            head_weight=head.weight.detach().cpu().clone() if plan.send_head else None,
            head_bias=head.bias.detach().cpu().clone() if plan.send_head else None,
            head_gram=head_gram, train_loss=loss, delta=self._dense_delta(plan) if full else {}, fisher=fisher)

    def _train(self, plan: RoundPlan, shard: Tensor, seed: int) -> float:
        """ACE training of the plan's factors and the head; returns the last epoch's mean loss."""
        cfg, model = self.config, self.model
        for layer in model.lora().values():
            layer.set_trainable(plan.train_factors)
        factor_params = [getattr(layer, f"lora_{f}") for layer in model.lora().values() for f in plan.train_factors]
        if plan.mode == Mode.FULL:
            factor_params = list(model.dense_params().values())  # every backbone weight, no LoRA
        for p in factor_params + list(model.head.parameters()):
            p.requires_grad_(True)
        groups = [{"params": list(model.head.parameters()), "lr": cfg.lr}]
        if factor_params:
            groups.append({"params": factor_params, "lr": cfg.lora_lr})
        optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout
        lo, hi = plan.class_range
        model.train(cfg.train_dropout)  # dropout on (the reference's train mode) or off
        loss_sum, batches = float("nan"), 0
        for _epoch in range(cfg.local_epochs):
            loss_sum, batches = 0.0, 0
            order = shard[torch.randperm(shard.numel(), generator=generator)]
            for start in range(0, order.numel(), cfg.batch_size):
                inputs, labels = self.train.batch(order[start:start + cfg.batch_size], self.device, train=True,
                                                  generator=generator)
                logits, _ = model(inputs)  # (batch, num_classes)
                # ACE: only the current task's classes compete; old heads get no gradient.
                loss = F.cross_entropy(logits[:, lo:hi], labels - lo)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                loss_sum += float(loss.detach())
                batches += 1
        for layer in model.lora().values():
            layer.set_trainable(())
        for p in model.dense_params().values():
            p.requires_grad_(False)
        return loss_sum / max(batches, 1)

    def _fisher(self, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        """Diagonal Fisher of the ACE model ``p(y|x)`` (the task's classes) at the trained weights.

        ``config.fisher`` picks the estimator (``common.config.FISHER_ESTIMATORS``), with
        ``g_y = d log p(y|x) / d theta`` per sample ``x`` (eval mode, no dropout):

        - ``sampled``: ``mean_x g_y^2``, ``y ~ p(.|x)`` (Matena & Raffel's Monte Carlo estimate);
        - ``expected``: ``mean_x sum_y p(y|x) g_y^2`` (the exact expectation);
        - ``reference``: ``sum_x p(y_x|x) g_{y_x}^2`` with the true label ``y_x``, summed, not
          averaged, as the paper's public code does;
        - ``batch``: ``sum_b |b| g_b^2 / n`` over mini-batch gradients ``g_b`` of the loss.

        Head entries are named ``head.weight`` and ``head.bias``.
        """
        model, lo, hi = self.model, *plan.class_range
        params = dict(model.dense_params()) | {f"head.{n}": p for n, p in model.head.named_parameters()}
        names, tensors = list(params), list(params.values())
        for p in tensors:
            p.requires_grad_(True)
        fisher = {n: torch.zeros(p.shape, dtype=torch.float64) for n, p in params.items()}

        def add(scalar: Tensor, weight: float, retain: bool = False) -> None:
            grads = torch.autograd.grad(scalar, tensors, allow_unused=True, retain_graph=retain)
            for name, g in zip(names, grads):
                if g is not None:
                    fisher[name] += g.detach().cpu().double() ** 2 * weight

        estimator = self.config.fisher
        generator = torch.Generator().manual_seed(seed ^ 0xF15E)
        model.eval()
        size = self.config.batch_size if estimator == "batch" else 1
        for start in range(0, shard.numel(), size):
            inputs, labels = self.train.batch(shard[start:start + size], self.device)
            log_p = F.log_softmax(model(inputs)[0][:, lo:hi], dim=1)  # (size, task classes)
            if estimator == "batch":
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
        for p in tensors:
            p.requires_grad_(False)
        scale = 1.0 if estimator == "reference" else 1.0 / max(shard.numel(), 1)
        return {n: f * scale for n, f in fisher.items()}

    @torch.no_grad()
    def _gram_pass(self, plan: RoundPlan, shard: Tensor, seed: int) -> tuple[dict[str, Tensor], Tensor | None]:
        """Grams over the shard, with the training augmentation as in the reference."""
        if plan.gram == GramKind.NONE and not plan.head_gram:
            return {}, None
        modules: dict = dict(self.model.lora()) if plan.gram != GramKind.NONE else {}
        full = {name: plan.gram == GramKind.FULL for name in modules}
        if plan.head_gram:
            modules["<head>"] = self.model.head
            full["<head>"] = True
        recorder = GramRecorder(modules, full)
        generator = torch.Generator().manual_seed(seed ^ 0x5EED)
        self.model.eval()
        with recorder.recording():
            for _ in range(self.config.gram_passes):
                for start in range(0, shard.numel(), GRAM_BATCH):
                    inputs, _ = self.train.batch(shard[start:start + GRAM_BATCH], self.device, train=True,
                                                 generator=generator, padded=self.config.gram_padding)
                    # Padding tokens are not inputs: their rows are left out of the Grams, unless the
                    # run counts them as the reference does (gram_padding).
                    recorder.row_mask = None if self.config.gram_padding else inputs.get("attention_mask")
                    self.model(inputs)
        grams = {name: g.cpu() for name, g in recorder.grams.items()}
        head_gram = grams.pop("<head>", None)
        return grams, head_gram

    @torch.no_grad()
    def evaluate(self, plan: RoundPlan) -> EvalReport:
        """Class-incremental accuracy: argmax over all seen classes, per seen task."""
        self.model.to(self.device)
        self._load(plan)
        self._set_view(plan)
        self.model.eval()
        seen = plan.seen_classes
        correct = [0] * (plan.task + 1)
        total = [0] * (plan.task + 1)
        labels = self.test.labels[self.test_idx]
        mine = self.test_idx[labels < seen]
        for start in range(0, mine.numel(), 256):
            inputs, y = self.test.batch(mine[start:start + 256], self.device)
            logits = (feature_logits(self.model, inputs, plan, self.config) if plan.mode == Mode.FEATURES
                      else self.model(inputs)[0])
            pred = logits[:, :seen].argmax(dim=1)
            for j, (lo, hi) in enumerate(self.tasks[: plan.task + 1]):
                in_task = (y >= lo) & (y < hi)
                correct[j] += int((pred[in_task] == y[in_task]).sum())
                total[j] += int(in_task.sum())
        return EvalReport(run_id=plan.run_id, client_id=self.client_id, client_index=self.index,
                          task=plan.task, correct=correct, total=total)
