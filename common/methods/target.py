"""TARGET (Zhang et al. 2023), federated by FedAvg: the shared part of its slice, its settings and its
registration. The server half is ``server/strategies/continual.py`` (``Target``), the client half
``client/methods/target.py`` (the dense training, distilling the previous task's model on synthetic inputs
of its classes, drawn data-free).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from common.methods import DENSE_ROUNDS, Method
from common.run.settings import Settings, at_least_one, finite_number, setting


@dataclass(frozen=True)
class TargetSettings(Settings):
    """TARGET (``target``): FedAvg, with distillation on synthetic inputs of the old classes drawn data-free
    from the previous task's model (defaults: the paper's code's)."""

    section: ClassVar[str] = "target"
    kd_alpha: float = setting(25.0, "lambda_KL: weight of the clients' distillation on synthetic inputs (25)")
    kd_temperature: float = setting(2.0, "temperature of that distillation (2)")
    rounds: int = setting(30, "g_ep: synthesis rounds, each adding one batch of synthetic inputs (30)")
    steps: int = setting(80, "generator steps per synthesis round (80)")
    batch: int = setting(16, "synthetic inputs per synthesis round, and per training batch's distillation (16)")
    warmup: int = setting(20, "synthesis rounds before the adversarial term and the student's training (20)")
    lr_generator: float = setting(
        0.002, "Adam learning rate of the generator (0.002; its meta-learned copy: steps times that)"
    )
    lr_z: float = setting(0.01, "Adam learning rate of the latent codes (0.01)")
    ce: float = setting(0.5, "weight of the teacher's cross-entropy on the requested classes (oh: 0.5)")
    adv: float = setting(1.0, "weight of the adversarial term, the student's disagreement with the teacher (1)")
    student_steps: int = setting(50, "the student's distillation steps per synthesis round after the warm-up (50)")
    student_temperature: float = setting(20.0, "temperature of the student's distillation (20)")
    student_lr: float = setting(
        0.002,
        "SGD learning rate of the student's distillation, momentum 0.9, weight decay 1e-4, constant (0.002, "
        "the paper's code's; TARGET's own code: 0.2, cosine-annealed)",
    )
    tokens: int = setting(16, "text: synthetic token embeddings per input (16)")
    latent: int = setting(256, "dimension of the generator's latent code (256)")

    def __post_init__(self) -> None:
        at_least_one(self, "rounds", "steps", "batch", "tokens", "latent")
        if not 0 <= self.warmup or self.student_steps < 0:
            raise ValueError("settings target.warmup and target.student_steps must be non-negative")
        for key in ("kd_alpha", "ce", "adv"):
            finite_number(f"target.{key}", getattr(self, key), 0.0)
        for key in ("kd_temperature", "lr_generator", "lr_z", "student_temperature", "student_lr"):
            finite_number(f"target.{key}", getattr(self, key), 0.0, strict=True)


METHOD = Method(
    "target",
    "server.strategies.continual:Target",
    "client.methods.target:TargetTrainer",
    "TARGET: FedAvg, distilling the previous task's model on synthetic inputs of its classes, drawn data-free",
    TargetSettings,
    steps=DENSE_ROUNDS,
    aggregator="common.aggregation.dense:fedavg",
)
