"""The client half of a method: what a client trains, with which loss, and what it sends.

``ClientWorker`` (``client/worker.py``) owns the data and the model and calls the method's
client half for every step; the half never branches on other methods. A half serves one
:class:`~common.wire.instructions.Mode` (:attr:`ClientMethod.mode`); the plans of its method ask for
that mode (a method whose steps differ in mode combines halves, see
``client.methods.features.LoRAThenFeatures``).

:meth:`ClientMethod.update` is a template: load the plan's model, train (``TRAIN`` steps:
:meth:`trainable` and :meth:`loss`, with the shared loop :meth:`train`), then collect what
to send (:meth:`outputs`). Evaluation loads the same way and scores with :meth:`logits`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Protocol

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from client.classifier import ClassifierModel
from client.dpsgd import (
    PerSampleNorms,
    expected_batch,
    gradient_noise,
    poisson_batches,
    private_step,
    sampling_bits,
)
from client.ledger import ClientLedger
from common.privacy.ledger import BudgetExceeded
from common.privacy.training import TrainingNoise
from common.run.config import RunConfig
from common.run.settings import DpSettings
from common.wire.instructions import LoraStep, Mode, TrainInstruction
from common.wire.messages import ClientUpdate, Phase, RoundPlan
from common.wire.tensors import (
    EXTRA,
    HEAD_BIAS,
    HEAD_WEIGHT,
    LORA,
    head_tensors,
)

PHASE_CODE = {Phase.TRAIN: 1, Phase.TASK_GRAM: 2, Phase.EVALUATE: 3, Phase.FEATURES: 4}


class Samples(Protocol):
    """The part of ``client.worker.SampleData`` a method uses."""

    labels: Tensor  # (n,) int64

    def batch(
        self,
        idx: Tensor,
        device: torch.device,
        *,
        train: bool = False,
        generator: torch.Generator | None = None,
        padded: bool = False,
    ) -> tuple[dict[str, Tensor], Tensor]: ...


class Client(Protocol):
    """What a method's client half sees of the worker: its configuration, model, data and shards."""

    config: RunConfig
    index: int  # the client's index
    client_id: str
    model: ClassifierModel
    device: torch.device
    shards: list[Tensor]  # per task: the client's training sample indices
    ledger: ClientLedger | None  # this client's own account of its records' releases (dp.mode local, distributed)

    @property
    def train(self) -> Samples: ...  # the client's training samples (all tasks; shards index them)

    @property
    def on_batch(self) -> Callable[[int, int], None] | None: ...  # (batches done, of total): progress


def private_noise(client: Client, plan: RoundPlan) -> TrainingNoise:
    """The mechanism that noises ``plan``'s step on ``client``: its ledger's plan, pinned at its first private step
    (``client/ledger.py``), never what a later step's instruction says."""
    if client.ledger is None:
        raise ValueError(f"dp: run {client.config.run_id} trains privately, but client {client.index} has no ledger")
    return client.ledger.noise(plan)


def step_update(client: Client, plan: RoundPlan, tensors: dict[str, Tensor], train_loss: float) -> ClientUpdate:
    """This client's update of ``plan``'s step: its identity, the step, its shard's sample count, its tensors
    (wire names) and its loss."""
    return ClientUpdate.of_step(
        plan, client.index, client.client_id, int(client.shards[plan.task].numel()), tensors, train_loss
    )


def step_seed(seed: int, client_index: int, task: int, round_: int, phase: Phase) -> int:
    """A 63-bit seed unique to one client's step."""
    state = np.random.SeedSequence([seed, client_index, task, round_, PHASE_CODE[phase]]).generate_state(2)
    return int(state[0]) << 31 ^ int(state[1])


class ClientMethod:
    """The client half of a method (stateless between steps: everything comes from the plan)."""

    mode: Mode = Mode.LORA  # the mode of the plans this half serves

    def serves(self, plan: RoundPlan) -> ClientMethod:
        """The half that handles ``plan``: this one, if the plan asks for its mode."""
        if plan.mode != self.mode:
            asked = plan.mode.value if plan.mode is not None else f"no mode ({plan.instruction.KIND!r})"
            raise ValueError(f"{type(self).__name__} serves {self.mode.value!r} plans; this plan asks for {asked!r}")
        return self

    # ----------------------------------------------------------------- hooks

    def load(self, client: Client, plan: RoundPlan) -> None:
        """Set the model this step starts from (training view): LoRA factors, extra, head."""
        load_lora(client, plan)
        load_head(client.model, plan)

    def trainable(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        """The backbone parameters trained at the LoRA learning rate (``lora_lr``)."""
        return []

    def head_params(self, client: Client, plan: RoundPlan) -> list[torch.nn.Parameter]:
        """The parameters trained at ``lr``: the head's (PILoRA: its class prototypes)."""
        return list(client.model.head.parameters())

    def loss(self, logits: Tensor, labels: Tensor, plan: RoundPlan) -> Tensor:
        """ACE: only the current task's classes compete; old heads get no gradient.

        ``logits: (batch, num_classes)``, ``labels: (batch,)`` in ``plan.class_range``.
        """
        lo, hi = plan.class_range
        return F.cross_entropy(logits[:, lo:hi], labels - lo)

    def sample_losses(self, logits: Tensor, labels: Tensor, plan: RoundPlan) -> Tensor:
        """``(batch,)``: each sample's :meth:`loss` (ACE), whose mean it is; DP-SGD clips each one's gradient."""
        lo, hi = plan.class_range
        return F.cross_entropy(logits[:, lo:hi], labels - lo, reduction="none")

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        """A term added to :meth:`loss` for each training batch (EWC's penalty, LwF's distillation,
        FedProto's prototype distance; ``labels (batch,)``); ``None``: nothing is added."""
        return None

    def outputs(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> dict[str, Tensor]:
        """What the update carries after training: its tensors by wire name (``common/wire/tensors.py``)."""
        return {}

    def forward(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        """The logits ``(batch, num_classes)`` of a training batch (the model's, unless the method
        feeds it more: L2P's and CODA-P's prompts)."""
        return client.model(inputs)[0]

    def logits(self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor]) -> Tensor:
        """Scores ``(batch, num_classes)`` of the evaluated model (after :meth:`load` and :func:`set_view`)."""
        return self.forward(client, plan, inputs)

    # ----------------------------------------------------------------- the step

    def update(self, client: Client, plan: RoundPlan) -> ClientUpdate:
        """One ``TRAIN`` or ``TASK_GRAM`` step: load, train (``TRAIN`` only), then :meth:`outputs`."""
        seed = step_seed(plan.seed, client.index, plan.task, plan.round, plan.phase)
        shard = client.shards[plan.task]
        client.model.to(client.device)
        self.load(client, plan)
        loss = self.train(client, plan, shard, seed) if plan.phase == Phase.TRAIN else float("nan")
        return step_update(client, plan, self.outputs(client, plan, shard, seed), loss)

    def train(self, client: Client, plan: RoundPlan, shard: Tensor, seed: int) -> float:
        """Train :meth:`trainable` and :meth:`head_params` with :meth:`loss`; returns the last epoch's mean loss.
        With a privacy budget (``dp.mode = local``), DP-SGD (:meth:`train_private`)."""
        cfg, model = client.config, client.model
        params = self.trainable(client, plan)
        head = self.head_params(client, plan)
        for p in params + head:
            p.requires_grad_(True)
        groups = [{"params": head, "lr": cfg.lr}]
        if params:
            groups.append({"params": params, "lr": cfg.lora_lr})
        optimizer = torch.optim.AdamW(groups, weight_decay=cfg.weight_decay)
        generator = torch.Generator().manual_seed(seed)
        torch.manual_seed(seed)  # dropout
        model.train(cfg.train_dropout)  # dropout on (the reference's train mode) or off
        dp = cfg.section(DpSettings)
        if dp.local:
            mean = self.train_private(client, plan, shard, params, head, optimizer, generator)
            self.freeze(client)
            return mean
        loss_sum, batches = float("nan"), 0
        per_epoch = -(-shard.numel() // cfg.batch_size)
        for epoch in range(cfg.local_epochs):
            loss_sum, batches = 0.0, 0
            order = shard[torch.randperm(shard.numel(), generator=generator)]
            for start in range(0, order.numel(), cfg.batch_size):
                inputs, labels = client.train.batch(
                    order[start : start + cfg.batch_size], client.device, train=True, generator=generator
                )
                logits = self.forward(client, plan, inputs)  # (batch, num_classes)
                loss = self.loss(logits, labels, plan)
                extra = self.regulariser(client, plan, inputs, logits, labels)
                if extra is not None:
                    loss = loss + extra
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
                loss_sum += float(loss.detach())
                batches += 1
                if client.on_batch is not None:
                    client.on_batch(epoch * per_epoch + batches, cfg.local_epochs * per_epoch)
        self.freeze(client)
        return loss_sum / batches if batches else float("nan")  # NaN: nothing trained (no epoch, or no sample)

    def train_private(
        self,
        client: Client,
        plan: RoundPlan,
        shard: Tensor,
        params: list[torch.nn.Parameter],
        head: list[torch.nn.Parameter],
        optimizer: torch.optim.Optimizer,
        generator: torch.Generator,
    ) -> float:
        """DP-SGD (``client/dpsgd.py``): the round's ``steps`` Poisson batches of the shard, each sample's gradient of
        ``params`` clipped to ``dp.clip``, Gaussian noise of the calibrated multiplier on the sum, divided by the
        expected batch. Returns NaN, not the round's mean loss: that is a statistic of the records that no noise
        covers, so a private client does not release it (the step's history has no loss). The head's rows of other
        tasks' classes get no gradient from any sample (ACE), so no noise either: they stay as received. A client
        with no record of the task trains nothing (it has nothing to protect, and sends what it received)."""
        cfg, model = client.config, client.model
        dp = cfg.section(DpSettings)
        if not shard.numel():
            return float("nan")
        noise = private_noise(client, plan)
        lo, hi = plan.class_range
        wanted = {id(p) for p in params + head}
        norms = PerSampleNorms(model, {n: p for n, p in model.named_parameters() if id(p) in wanted})
        source = gradient_noise(dp.seed, client.index, plan.task, plan.round)
        expected = expected_batch(shard.numel(), noise)
        sigma = noise.noise_multiplier * dp.clip
        if not sigma > 0:  # the last check before training: no plan or setting may train un-noised
            raise BudgetExceeded(f"dp: DP-SGD on task {plan.task}'s records with noise deviation {sigma}: refused")
        batches = poisson_batches(shard.numel(), noise, sampling_bits(dp.seed, client.index, plan.task, plan.round))
        for done, positions in enumerate(batches, start=1):
            losses = torch.zeros(0)
            if positions.numel():
                inputs, labels = client.train.batch(shard[positions], client.device, train=True, generator=generator)
                with norms.recording(positions.numel()):
                    logits = self.forward(client, plan, inputs)
                losses = self.sample_losses(logits, labels, plan)
            private_step(params + head, norms, losses, dp.clip, sigma, expected, source)
            for p in head:
                assert p.grad is not None
                p.grad[:lo] = 0.0
                p.grad[hi:] = 0.0
            optimizer.step()
            if client.on_batch is not None:
                client.on_batch(done, len(batches))
        return float("nan")

    @staticmethod
    def freeze(client: Client) -> None:
        """Every backbone parameter back to frozen after training."""
        for layer in client.model.lora().values():
            layer.set_trainable(())
        for p in client.model.dense_params().values():
            p.requires_grad_(False)


# --------------------------------------------------------------------- shared model set-up


def load_lora(client: Client, plan: RoundPlan, delta: dict[str, Tensor] | None = None) -> None:
    """The training view ``W0 + s B A`` (``W0 + extra + s B A`` with ``plan.train_extra``).

    Backbone weights are ``W0 + delta`` (``W0`` when ``delta`` is ``None`` and the model was
    never fine-tuned densely: then nothing is copied).
    """
    model = client.model
    if delta is not None or model._pristine is not None:
        load_dense(model, delta or {})
    shared = plan.low_rank(LORA)
    step = plan.instruction
    extras = plan.low_rank(EXTRA) if isinstance(step, LoraStep) and step.train_extra else {}
    for name, layer in model.lora().items():
        if name in shared:
            layer.load_factors(shared[name].b, shared[name].a)
        layer.scale = client.config.lora_scale if name in shared else 0.0
        extra = extras.get(name)
        layer.set_extra(extra.b if extra else None, extra.a if extra else None)


def load_head(model: ClassifierModel, plan: RoundPlan) -> None:
    """Copy the plan's head ``(C, F)``, ``(C,)`` into the model, when it carries one."""
    weight, bias = plan.get(HEAD_WEIGHT), plan.get(HEAD_BIAS)
    if weight is not None:
        assert bias is not None  # a plan carries both or neither
        with torch.no_grad():
            model.head.weight.copy_(weight)
            model.head.bias.copy_(bias)


@torch.no_grad()
def load_dense(model: ClassifierModel, delta: dict[str, Tensor]) -> None:
    """Backbone weights ``W0 + delta`` (``W0`` for parameters ``delta`` lacks)."""
    w0 = model.pristine()
    for name, p in model.dense_params().items():
        value = w0[name] if name not in delta else w0[name] + delta[name].to(w0[name].dtype)
        p.copy_(value.to(p.device))


def set_view(client: Client, plan: RoundPlan) -> None:
    """Switch to the Gram-pass / evaluation view ``W0 + extra + view_scale * s B A`` (``s``: the run's
    ``lora_scale``; ``view_scale``: the step's weight of the current factors, ``LoraStep.view_scale``)."""
    shared, extras = plan.low_rank(LORA), plan.low_rank(EXTRA)
    step = plan.instruction
    view_scale = step.view_scale if isinstance(step, LoraStep) else 1.0
    for name, layer in client.model.lora().items():
        layer.scale = client.config.lora_scale * view_scale if name in shared else 0.0
        extra = extras.get(name)
        layer.set_extra(extra.b if extra else None, extra.a if extra else None)


def sent_head(model: ClassifierModel, plan: RoundPlan) -> dict[str, Tensor]:
    """The trained head's weight ``(C, F)`` and bias ``(C,)`` when the plan asks for them (``send_head``)."""
    if not plan.expect(TrainInstruction).send_head:
        return {}
    return head_tensors(model.head.weight.detach().cpu().clone(), model.head.bias.detach().cpu().clone())
