"""The client half of TARGET (Zhang et al. 2023): FedAvg fine-tuning with distillation on synthetic data.

From the second task on, each training batch adds ``kd_alpha * KD`` on a batch of synthetic
inputs: the cross-entropy of the model's softened old-class outputs against those of the
previous task's global model (``W0 + plan.anchor``, :func:`previous_model`), temperature
``kd_temperature``. The synthetic inputs are drawn data-free from that model (:func:`synthesize`):
a generator is trained so that the model classifies its outputs as requested old classes, with an
adversarial term that seeks inputs on which a student (trained meanwhile to mimic the model on the
inputs so far) disagrees with it; a meta-learned generator is refined per round (first-order MAML)
and the round's best batch kept, as the paper's code does. Transformers have no batch-norm
statistics to match, so that term of the original is absent (the paper's code skips it on ViT
too). Text: the generator emits token embeddings, fed to the encoder as ``inputs_embeds``
(``Backbone.prompted`` with no tokens); images: pixels at the backbone's input size.

Where it runs: the original trains the generator on the server. This project's coordinator never
builds a model, so each client synthesises from the plan's weights with the run's seed: the same
inputs on every client of a given device type (bit-identical on CPU), computed once per process and
task (:data:`_POOLS`), never sent. That is the server's computation replicated, not data: the
synthesis reads no client sample.
"""

from __future__ import annotations

import copy
import hashlib
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from client.classifier import ClassifierModel
from client.methods.base import Client
from client.methods.continual import distillation, previous_model
from client.methods.dense import DenseTrainer
from common.methods.target import TargetSettings
from common.wire.messages import RoundPlan
from common.wire.tensors import ANCHOR

_POOLS: dict[str, Tensor] = {}  # (run, task, teacher) digest -> synthetic inputs, this process's


def logits_of(model: ClassifierModel, x: Tensor) -> Tensor:
    """Logits ``(n, C)`` of synthetic inputs: images ``(n, 3, H, W)``, or token embeddings ``(n, L, F)``."""
    backbone = model.backbone
    if x.dim() == 4:
        return model.head(backbone(pixel_values=x))
    empty = torch.zeros(x.shape[0], 0, dtype=torch.long, device=x.device)
    features, _ = backbone.prompted(x, input_ids=empty, attention_mask=empty)
    return model.head(features)


class TextGenerator(nn.Module):
    """``z (n, latent)`` -> token embeddings ``(n, tokens, width)``."""

    def __init__(self, latent: int, tokens: int, width: int) -> None:
        super().__init__()
        self.tokens, self.width = tokens, width
        self.net = nn.Sequential(nn.Linear(latent, 2 * width), nn.LeakyReLU(0.2), nn.Linear(2 * width, tokens * width))

    def forward(self, z: Tensor) -> Tensor:
        return self.net(z).view(z.shape[0], self.tokens, self.width)


class ImageGenerator(nn.Module):
    """``z (n, latent)`` -> images ``(n, 3, size, size)`` in ``[-1, 1]`` (TARGET's generator: a linear map to a
    quarter-size map, two upsampling convolution blocks with batch norm, then a sigmoid, normalised by 0.5)."""

    def __init__(self, latent: int, size: int, channels: int = 64) -> None:
        super().__init__()
        self.start = max(size // 4, 1)
        self.channels = channels
        self.linear = nn.Linear(latent, 2 * channels * self.start**2)
        self.blocks = nn.Sequential(
            nn.BatchNorm2d(2 * channels),
            nn.Upsample(size=(2 * self.start, 2 * self.start)),
            nn.Conv2d(2 * channels, 2 * channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(2 * channels),
            nn.LeakyReLU(0.2),
            nn.Upsample(size=(size, size)),
            nn.Conv2d(2 * channels, channels, 3, padding=1, bias=False),
            nn.BatchNorm2d(channels),
            nn.LeakyReLU(0.2),
            nn.Conv2d(channels, 3, 3, padding=1),
            nn.Sigmoid(),
        )

    def forward(self, z: Tensor) -> Tensor:
        x = self.linear(z).view(z.shape[0], 2 * self.channels, self.start, self.start)
        return (self.blocks(x) - 0.5) / 0.5


def make_generator(model: ClassifierModel, s: TargetSettings) -> nn.Module:
    vit = getattr(model.backbone, "vit", None)
    if vit is not None:
        return ImageGenerator(s.latent, int(vit.patch_embed.img_size[0]))
    return TextGenerator(s.latent, s.tokens, model.backbone.feature_dim)


def per_sample_kl(student: Tensor, teacher: Tensor, temperature: float) -> Tensor:
    """``T^2 KL(softmax(t/T) || softmax(s/T))`` per sample ``(n,)``."""
    p = F.softmax(teacher / temperature, dim=1)
    return (p * (F.log_softmax(teacher / temperature, dim=1) - F.log_softmax(student / temperature, dim=1))).sum(
        1
    ) * temperature**2


def synthesize(
    teacher: ClassifierModel, classes: int, s: TargetSettings, seed: int, device: torch.device
) -> tuple[Tensor, Tensor]:
    """``rounds * batch`` synthetic inputs for the classes ``[0, classes)`` of ``teacher`` (frozen, eval),
    and the class each was requested as (the clients distil on the teacher's outputs, not on these).

    Per round: latent codes ``z`` and requested classes ``y``; a copy of the meta-generator and ``z``
    take ``steps`` Adam steps on ``ce * CE(teacher(x), y) + adv * L_adv``, ``L_adv`` (after ``warmup``
    rounds) minus the student's KL to the teacher on the samples where both agree; the step of least
    loss gives the round's batch; the copy's gradients, summed over the steps, update the
    meta-generator (first-order MAML); after ``warmup`` rounds the student distils the teacher on all
    inputs so far for ``student_steps`` SGD steps. Seeded by ``seed`` alone."""
    gen = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        generator = make_generator(teacher, s).to(device)
        student = copy.deepcopy(teacher)
        for module in student.modules():  # a fresh student, as the paper's code re-initialises it
            if isinstance(module, nn.Linear):
                nn.init.xavier_normal_(module.weight)
                if module.bias is not None:
                    nn.init.normal_(module.bias)
    for p in student.parameters():
        p.requires_grad_(True)
    student.eval()  # no dropout in the student's forward passes
    meta = torch.optim.Adam(generator.parameters(), lr=s.lr_generator * s.steps, betas=(0.5, 0.999))
    student_opt = torch.optim.SGD(student.parameters(), lr=s.student_lr, momentum=0.9, weight_decay=1e-4)
    pool: list[Tensor] = []
    requested: list[Tensor] = []
    for round_ in range(s.rounds):
        z = torch.randn(s.batch, s.latent, generator=gen).to(device).requires_grad_(True)
        y = torch.randint(0, classes, (s.batch,), generator=gen).to(device)
        fast = copy.deepcopy(generator)
        groups: list[dict[str, Any]] = [{"params": fast.parameters()}, {"params": [z], "lr": s.lr_z}]
        optimizer = torch.optim.Adam(groups, lr=s.lr_generator, betas=(0.5, 0.999))
        meta.zero_grad(set_to_none=False)
        best, best_loss = None, float("inf")
        for _ in range(s.steps):
            x = fast(z)
            t_out = logits_of(teacher, x)[:, :classes]
            loss = s.ce * F.cross_entropy(t_out, y)
            if s.adv > 0 and round_ >= s.warmup:
                s_out = logits_of(student, x)[:, :classes]
                agree = (s_out.argmax(1) == t_out.argmax(1)).to(s_out.dtype)
                loss = loss - s.adv * (per_sample_kl(s_out, t_out, 1.0) * agree).mean()
            if loss.detach().item() < best_loss:
                best, best_loss = x.detach().clone(), loss.detach().item()
            optimizer.zero_grad()
            loss.backward()
            for p, q in zip(generator.parameters(), fast.parameters()):
                if q.grad is not None:
                    p.grad = q.grad.clone() if p.grad is None else p.grad + q.grad
            optimizer.step()
        meta.step()
        assert best is not None
        pool.append(best)
        requested.append(y)
        if round_ >= s.warmup:
            inputs = torch.cat(pool)
            for _ in range(s.student_steps):
                idx = torch.randint(0, inputs.shape[0], (min(s.batch, inputs.shape[0]),), generator=gen)
                with torch.no_grad():
                    target = logits_of(teacher, inputs[idx.to(device)])
                out = logits_of(student, inputs[idx.to(device)])
                loss = per_sample_kl(out, target, s.student_temperature).mean()
                student_opt.zero_grad()
                loss.backward()
                torch.nn.utils.clip_grad_norm_(student.parameters(), 1.0)
                student_opt.step()
    return torch.cat(pool).detach(), torch.cat(requested)


def pool_key(plan: RoundPlan, seed: int, s: TargetSettings) -> str:
    """What the synthetic inputs depend on: the run, task, seed, settings and the teacher's weights (the
    anchor: backbone and head), which stay the same through the task, so the pool is drawn once a task."""
    h = hashlib.sha256(f"{plan.run_id}|{plan.task}|{seed}|{s}".encode())
    anchor = plan.named(ANCHOR)
    for name in sorted(anchor):
        h.update(name.encode())
        h.update(anchor[name].detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


class TargetTrainer(DenseTrainer):
    """:class:`DenseTrainer` with distillation from the previous task's model on synthetic inputs of its classes."""

    def load(self, client: Client, plan: RoundPlan) -> None:
        super().load(client, plan)
        self.settings = client.config.section(TargetSettings)
        self.teacher = previous_model(client, plan)
        self.pool: Tensor | None = None
        if self.teacher is not None:
            seed = client.config.seed * 1_000_003 + 43 * (plan.task + 1)
            key = pool_key(plan, seed, self.settings)
            if key not in _POOLS:
                _POOLS.clear()  # one task's pool at a time
                _POOLS[key] = synthesize(self.teacher, plan.class_range[0], self.settings, seed, client.device)[0]
            self.pool = _POOLS[key]
            self.draw = torch.Generator().manual_seed(seed ^ (client.index + 1) ^ (plan.round << 20))

    def regulariser(
        self, client: Client, plan: RoundPlan, inputs: dict[str, Tensor], logits: Tensor, labels: Tensor
    ) -> Tensor | None:
        if self.teacher is None or self.pool is None or self.settings.kd_alpha == 0.0:
            return None
        lo = plan.class_range[0]
        idx = torch.randint(0, self.pool.shape[0], (self.settings.batch,), generator=self.draw)
        x = self.pool[idx.to(self.pool.device)]
        with torch.no_grad():
            old = logits_of(self.teacher, x)[:, :lo]
        new = logits_of(client.model, x)[:, :lo]
        return self.settings.kd_alpha * distillation(new, old, self.settings.kd_temperature)
